/* A job for tests/tests/trace_rings.rs: several threads of each rank in
 * MPI at once while recorded, each through its own ring.
 *
 * usage: threads ITERS GOFILE
 * MPI_THREAD_MULTIPLE. Every rank prints "READY <rank> <pid>"; rank 0 waits
 * for GOFILE while the others wait in MPI_Barrier. Then THREADS threads of
 * every rank, thread t, ITERS times: MPI_Isend to right (tag t), MPI_Recv
 * from left (tag t; MPI_ANY_SOURCE every other time), MPI_Wait. Per pair
 * (r, right): THREADS * ITERS messages. The main thread joins them, calls
 * MPI_Barrier, checks what the threads received, prints "OK <rank>" and
 * finalizes; a wrong value aborts. */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define THREADS 3

static int rank, size, iters, wrong;

static void *work(void *arg) {
    int t = (int)(long)arg, right = (rank + 1) % size, left = (rank + size - 1) % size;
    for (int i = 0; i < iters; i++) {
        int out = rank * 100000 + t * 10000 + i, in = -1;
        MPI_Request r;
        MPI_Isend(&out, 1, MPI_INT, right, t, MPI_COMM_WORLD, &r);
        MPI_Recv(&in, 1, MPI_INT, (i % 2) ? MPI_ANY_SOURCE : left, t, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
        MPI_Wait(&r, MPI_STATUS_IGNORE);
        if (in != left * 100000 + t * 10000 + i)
            __atomic_add_fetch(&wrong, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (provided < MPI_THREAD_MULTIPLE || argc != 3) {
        fprintf(stderr, "usage: threads ITERS GOFILE (needs MPI_THREAD_MULTIPLE)\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    iters = atoi(argv[1]);
    printf("READY %d %d\n", rank, (int)getpid());
    fflush(stdout);
    if (rank == 0)
        while (access(argv[2], F_OK) != 0)
            usleep(10000);
    MPI_Barrier(MPI_COMM_WORLD);

    pthread_t th[THREADS];
    for (long t = 0; t < THREADS; t++)
        pthread_create(&th[t], NULL, work, (void *)t);
    for (int t = 0; t < THREADS; t++)
        pthread_join(th[t], NULL);
    MPI_Barrier(MPI_COMM_WORLD);
    if (wrong) {
        fprintf(stderr, "WRONG %d values on rank %d\n", wrong, rank);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    printf("OK %d\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
