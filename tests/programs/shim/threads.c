/* Four threads under MPI_THREAD_MULTIPLE, each on its own duplicate of
 * MPI_COMM_WORLD, exchange ITERS messages with the same thread of the peer
 * rank (ranks pair up 0-1, 2-3, ...). The tools count every send, receive
 * and rank query: the totals must be exact. */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define THREADS 4
#define ITERS 500

static MPI_Comm comms[THREADS];
static int rank;

static void *work(void *arg) {
    int t = (int)(long)arg, me, peer = rank ^ 1, v = 0;
    for (int i = 0; i < ITERS; i++) {
        MPI_Comm_rank(comms[t], &me);
        if (me % 2 == 0) {
            MPI_Send(&i, 1, MPI_INT, peer, t, comms[t]);
            MPI_Recv(&v, 1, MPI_INT, peer, t, comms[t], MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(&v, 1, MPI_INT, peer, t, comms[t], MPI_STATUS_IGNORE);
            MPI_Send(&v, 1, MPI_INT, peer, t, comms[t]);
        }
        if (v != i) {
            fprintf(stderr, "thread %d got %d, expected %d\n", t, v, i);
            exit(3);
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    int provided;
    pthread_t th[THREADS];
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    if (provided != MPI_THREAD_MULTIPLE) {
        fprintf(stderr, "MPI_THREAD_MULTIPLE not provided (%d)\n", provided);
        return 2;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    for (int t = 0; t < THREADS; t++)
        MPI_Comm_dup(MPI_COMM_WORLD, &comms[t]);
    for (int t = 0; t < THREADS; t++)
        pthread_create(&th[t], NULL, work, (void *)(long)t);
    for (int t = 0; t < THREADS; t++)
        pthread_join(th[t], NULL);
    for (int t = 0; t < THREADS; t++)
        MPI_Comm_free(&comms[t]);
    printf("shimtest threads rank=%d done\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
