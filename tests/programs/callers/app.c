/* The C caller for the fidelity tests, on 2 ranks. Every MPI call a tool
 * wraps sits alone on a line marked with a comment CALL:name; the test
 * finds the line numbers here, and the tools must name exactly these lines.
 * The main thread makes a Send/Recv, a Sendrecv (12 arguments, 6 of them
 * on the stack), a Barrier and an Allreduce; then 4 threads under
 * MPI_THREAD_MULTIPLE each make ITERS Sendrecv calls from a line of their
 * own, on their own duplicate of MPI_COMM_WORLD. Every payload is checked;
 * a wrong one aborts. Compiled with -g -O1. */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>

#define THREADS 4
#define ITERS 3

static MPI_Comm comms[THREADS];
static int rank, peer;

static void check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "callers app rank %d: %s\n", rank, what);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
}

/* Thread t's round i: one Sendrecv from thread t's own line. */
static void exchange(int t, int i) {
    int out = rank * 1000 + t * 10 + i, in = -1;
    MPI_Status st;
    MPI_Comm c = comms[t];
    switch (t) {
    case 0:
        MPI_Sendrecv(&out, 1, MPI_INT, peer, t, &in, 1, MPI_INT, peer, t, c, &st); /* CALL:thread0 */
        break;
    case 1:
        MPI_Sendrecv(&out, 1, MPI_INT, peer, t, &in, 1, MPI_INT, peer, t, c, &st); /* CALL:thread1 */
        break;
    case 2:
        MPI_Sendrecv(&out, 1, MPI_INT, peer, t, &in, 1, MPI_INT, peer, t, c, &st); /* CALL:thread2 */
        break;
    default:
        MPI_Sendrecv(&out, 1, MPI_INT, peer, t, &in, 1, MPI_INT, peer, t, c, &st); /* CALL:thread3 */
        break;
    }
    check(in == peer * 1000 + t * 10 + i, "a thread's Sendrecv payload");
}

static void *work(void *arg) {
    int t = (int)(long)arg;
    for (int i = 0; i < ITERS; i++)
        exchange(t, i);
    return NULL;
}

int main(int argc, char **argv) {
    int provided, size, v = 42, w = 0, one = 1, sum = 0;
    double out[3], in[3] = {0};
    MPI_Status st;
    pthread_t th[THREADS];
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    check(provided == MPI_THREAD_MULTIPLE, "MPI_THREAD_MULTIPLE not provided");
    check(size == 2, "run on 2 ranks");
    peer = rank ^ 1;

    if (rank == 0)
        MPI_Send(&v, 1, MPI_INT, 1, 7, MPI_COMM_WORLD); /* CALL:send */
    else
        MPI_Recv(&w, 1, MPI_INT, 0, 7, MPI_COMM_WORLD, &st); /* CALL:recv */
    check(rank == 0 || w == 42, "Recv payload");

    /* Different send and receive tags: the receive tag is a stack-passed argument. */
    for (int i = 0; i < 3; i++)
        out[i] = rank * 10.0 + i;
    MPI_Sendrecv(out, 3, MPI_DOUBLE, peer, 20 + rank, in, 3, MPI_DOUBLE, peer, 20 + peer, MPI_COMM_WORLD, &st); /* CALL:sendrecv */
    check(st.MPI_SOURCE == peer && st.MPI_TAG == 20 + peer, "Sendrecv status");
    for (int i = 0; i < 3; i++)
        check(in[i] == peer * 10.0 + i, "Sendrecv payload");

    MPI_Barrier(MPI_COMM_WORLD); /* CALL:barrier */
    MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD); /* CALL:allreduce */
    check(sum == 2, "Allreduce result");

    for (int t = 0; t < THREADS; t++)
        MPI_Comm_dup(MPI_COMM_WORLD, &comms[t]);
    for (int t = 0; t < THREADS; t++)
        pthread_create(&th[t], NULL, work, (void *)(long)t);
    for (int t = 0; t < THREADS; t++)
        pthread_join(th[t], NULL);
    for (int t = 0; t < THREADS; t++)
        MPI_Comm_free(&comms[t]);

    printf("callers app rank=%d ok\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
