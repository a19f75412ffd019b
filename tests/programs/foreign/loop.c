/* A "rank" of another instruction set: built for aarch64 against the
 * stand-in MPI library (xtask/qemu/fake_mpi.c) and run by qemu-user on the
 * x86-64 host (tests/tests/e2e/foreign.rs). Calls MPI_Send every 10 ms for
 * argv[1] seconds and prints how many calls it made and how many failed. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int MPI_Init(int *argc, char ***argv);
int MPI_Send(const void *buf, int count, int type, int dest, int tag, int comm);
int MPI_Finalize(void);

int main(int argc, char **argv) {
    int buf[3] = {1, 2, 3};
    long calls = 0, failed = 0;
    time_t end = time(NULL) + (argc > 1 ? atoi(argv[1]) : 5);
    MPI_Init(&argc, &argv);
    while (time(NULL) < end) {
        failed += MPI_Send(buf, 3, 11, 1, 42, 7) != 0;
        calls++;
        usleep(10000);
    }
    MPI_Finalize();
    printf("app: sends=%ld failed=%ld\n", calls, failed);
    fflush(stdout);
    return 0;
}
