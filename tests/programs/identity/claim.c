/* A rank with a known number of calls, for the identity tests.
 *
 * usage: claim ITERS GOFILE
 * Every rank prints "READY <rank> <pid>", waits (without MPI calls) until
 * GOFILE exists, then makes ITERS MPI_Barrier and ITERS MPI_Allreduce calls,
 * checks every sum and prints "OK <rank>", or exits non-zero. Who it claims
 * to be is its environment's business (tests/tests/identity.rs). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int iters = argc > 1 ? atoi(argv[1]) : 10;
    const char *go = argc > 2 ? argv[2] : NULL;
    printf("READY %d %d\n", rank, (int)getpid());
    fflush(stdout);
    while (go && access(go, F_OK) != 0) usleep(20000);
    for (int it = 0; it < iters; it++) {
        MPI_Barrier(MPI_COMM_WORLD);
        int one = 1, total = 0;
        MPI_Allreduce(&one, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        if (total != size) {
            fprintf(stderr, "WRONG allreduce rank %d iter %d\n", rank, it);
            MPI_Abort(MPI_COMM_WORLD, 3);
        }
    }
    printf("OK %d\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
