/* The program of the qemu-user run of the aarch64 shim: MPI calls as an
 * application makes them, linked against fake_mpi.c's library. Prints one
 * line per call with its result. */
#include <stdio.h>

int MPI_Init(int *argc, char ***argv);
int MPI_Comm_rank(int comm, int *rank);
int MPI_Send(const void *buf, int count, int type, int dest, int tag, int comm);
int PMPI_Send(const void *buf, int count, int type, int dest, int tag, int comm);
int MPI_Finalize(void);

int main(int argc, char **argv) {
    int rank = -1, buf[3] = {1, 2, 3};
    printf("app: init=%d\n", MPI_Init(&argc, &argv));
    int rc = MPI_Comm_rank(7, &rank);
    printf("app: comm_rank=%d rank=%d\n", rc, rank);
    for (int i = 0; i < 3; i++)
        printf("app: send=%d\n", MPI_Send(buf, 3, 11, 1, 42, 7));
    /* The profiling spelling enters below the tool. */
    printf("app: psend=%d\n", PMPI_Send(buf, 3, 11, 1, 42, 7));
    printf("app: finalize=%d\n", MPI_Finalize());
    fflush(stdout);
    return 0;
}
