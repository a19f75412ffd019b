/* The honest job of the attack tests: a known number of calls.
 *
 * usage: victim ITERS GOFILE
 * Every rank prints "READY <rank> <pid>", waits without MPI calls until
 * GOFILE exists, then makes exactly ITERS MPI_Allreduce and ITERS
 * MPI_Barrier calls, checks every sum, and prints "OK <rank>".
 * With VICTIM_POLL set, the wait makes an MPI_Iprobe call every 20 ms, so
 * an observed rank has figures while it still runs. */
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
    int poll = getenv("VICTIM_POLL") != NULL;
    while (go && access(go, F_OK) != 0) {
        if (poll) {
            int flag;
            MPI_Iprobe(MPI_ANY_SOURCE, 999, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
        }
        usleep(20000);
    }
    for (int it = 0; it < iters; it++) {
        long in = rank + it, out = 0;
        MPI_Allreduce(&in, &out, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        if (out != (long)size * (size - 1) / 2 + (long)size * it) {
            fprintf(stderr, "WRONG allreduce rank %d iter %d\n", rank, it);
            MPI_Abort(MPI_COMM_WORLD, 3);
        }
        MPI_Barrier(MPI_COMM_WORLD);
    }
    printf("OK %d\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
