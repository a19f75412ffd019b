/* A PMPI tool for the qemu-user run of the aarch64 shim: counts the calls
 * of MPI_Send it sees and passes them on through PMPI_Send, which the shim
 * binds to the level below. */
#include <stdio.h>

int PMPI_Send(const void *buf, int count, int type, int dest, int tag, int comm);

static long sends;

int MPI_Send(const void *buf, int count, int type, int dest, int tag, int comm) {
    sends++;
    return PMPI_Send(buf, count, type, dest, tag, comm);
}

__attribute__((destructor)) static void report(void) {
    printf("tool: send=%ld\n", sends);
}
