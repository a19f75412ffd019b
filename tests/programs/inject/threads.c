/* MPI_THREAD_MULTIPLE traffic from 4 threads per rank, for injection.
 *
 * usage: threads ROUNDS GOFILE
 * Two ranks. Every rank prints "READY <rank> <pid>"; until GOFILE exists its
 * main thread makes an MPI_Iprobe call every 2 ms (the injection's stop
 * point). Then 4 threads per rank each make ROUNDS MPI_Sendrecv calls with
 * the same thread of the other rank (tag = thread), 8 ints each way, and
 * check every payload; the rank prints "OK <rank>" or exits non-zero. */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define THREADS 4
#define N 8

static int rank, rounds;

static void *work(void *arg) {
    int t = (int)(long)arg, peer = 1 - rank;
    for (int i = 0; i < rounds; i++) {
        int out[N], in[N];
        for (int k = 0; k < N; k++) out[k] = rank * 1000000 + t * 10000 + i * 10 + k;
        MPI_Sendrecv(out, N, MPI_INT, peer, t, in, N, MPI_INT, peer, t, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        for (int k = 0; k < N; k++)
            if (in[k] != peer * 1000000 + t * 10000 + i * 10 + k) {
                fprintf(stderr, "WRONG rank %d thread %d round %d\n", rank, t, i);
                MPI_Abort(MPI_COMM_WORLD, 3);
            }
    }
    return NULL;
}

int main(int argc, char **argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    if (provided < MPI_THREAD_MULTIPLE) {
        fprintf(stderr, "no MPI_THREAD_MULTIPLE\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    rounds = argc > 1 ? atoi(argv[1]) : 100;
    const char *go = argc > 2 ? argv[2] : NULL;
    printf("READY %d %d\n", rank, (int)getpid());
    fflush(stdout);
    while (go && access(go, F_OK) != 0) {
        int flag;
        MPI_Iprobe(MPI_ANY_SOURCE, 999, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
        usleep(2000);
    }
    pthread_t th[THREADS];
    for (long t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, work, (void *)t);
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    MPI_Barrier(MPI_COMM_WORLD);
    printf("OK %d\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
