/* A short rank for the discovery test: lives about half a second.
 *
 * usage: short ITERS
 * Prints "PID <rank> <pid>", waits 200 ms (the daemon finds a rank within
 * milliseconds of its exec; this only keeps the count exact), makes ITERS
 * MPI_Barrier calls and prints "OK <rank>". */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int iters = argc > 1 ? atoi(argv[1]) : 10;
    printf("PID %d %d\n", rank, (int)getpid());
    fflush(stdout);
    usleep(200000);
    for (int it = 0; it < iters; it++)
        MPI_Barrier(MPI_COMM_WORLD);
    printf("OK %d\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
