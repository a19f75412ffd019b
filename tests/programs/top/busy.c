/* A job for `mpi-observer top`'s end-to-end test (tests/tests/top.rs): it runs
 * until told to stop, with a known busiest function and a known straggler.
 *
 * usage: busy STOPFILE
 * Every rank prints "READY <rank> <pid>" and loops: it "computes" (sleeps)
 * 1 ms, the last rank 4 ms, then calls MPI_Barrier, where every other rank
 * waits about 3 ms for the last one, so MPI_Barrier is the job's busiest
 * function and the last rank the one with the least MPI time; then a 1 KiB
 * ring MPI_Sendrecv, and an MPI_Allreduce that carries rank 0's "STOPFILE
 * exists" to every rank, so all leave the loop after the same iteration.
 * Each rank checks what it received, prints "OK <rank>" and finalizes. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define N 256 /* ints: 1 KiB per Sendrecv half */

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc != 2) {
        fprintf(stderr, "usage: busy STOPFILE\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    printf("READY %d %d\n", rank, (int)getpid());
    fflush(stdout);

    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    int out[N], in[N];
    for (long it = 0;; it++) {
        usleep(rank == size - 1 ? 4000 : 1000);
        MPI_Barrier(MPI_COMM_WORLD);
        for (int i = 0; i < N; i++) out[i] = rank * 1000 + (int)(it % 1000) + i;
        MPI_Sendrecv(out, N, MPI_INT, right, 1, in, N, MPI_INT, left, 1, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        if (in[N - 1] != left * 1000 + (int)(it % 1000) + N - 1) {
            fprintf(stderr, "WRONG sendrecv rank %d iter %ld\n", rank, it);
            MPI_Abort(MPI_COMM_WORLD, 3);
        }
        int mine = rank == 0 && access(argv[1], F_OK) == 0, stop = 0;
        MPI_Allreduce(&mine, &stop, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (stop)
            break;
    }
    printf("OK %d\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
