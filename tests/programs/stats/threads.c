/* MPI_THREAD_MULTIPLE: on every rank, 4 threads each exchange 200 messages
 * of 8*(thread+1) bytes with the ring neighbours, blocking and nonblocking,
 * with and without wildcards, all at once. The figures must be exact.
 * Prints READY and waits for the go file (argv[1]) like traffic.c. */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#define THREADS 4
#define MSGS 200

static int rank;

static void *work(void *arg) {
    int t = (int)(long)arg, right = (rank + 1) % 4, left = (rank + 3) % 4;
    char out[64] = {0}, in[64];
    for (int i = 0; i < MSGS; i++) {
        MPI_Request r[2];
        int src = (i % 2) ? MPI_ANY_SOURCE : left;
        if (i % 3 == 0) {
            MPI_Irecv(in, 64, MPI_BYTE, src, t, MPI_COMM_WORLD, &r[0]);
            MPI_Isend(out, 8 * (t + 1), MPI_BYTE, right, t, MPI_COMM_WORLD, &r[1]);
            MPI_Waitall(2, r, MPI_STATUSES_IGNORE);
        } else {
            MPI_Isend(out, 8 * (t + 1), MPI_BYTE, right, t, MPI_COMM_WORLD, &r[1]);
            MPI_Recv(in, 64, MPI_BYTE, src, t, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Wait(&r[1], MPI_STATUS_IGNORE);
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    if (provided < MPI_THREAD_MULTIPLE) {
        fprintf(stderr, "MPI_THREAD_MULTIPLE not provided\n");
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    pthread_t th[THREADS];
    for (long t = 0; t < THREADS; t++)
        pthread_create(&th[t], NULL, work, (void *)t);
    for (int t = 0; t < THREADS; t++)
        pthread_join(th[t], NULL);
    const char *go = argc > 1 ? argv[1] : NULL;
    printf("READY %d %d\n", rank, (int)getpid());
    fflush(stdout);
    while (go && access(go, F_OK) != 0)
        usleep(20000);
    MPI_Barrier(MPI_COMM_WORLD);
    printf("DONE %d\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
