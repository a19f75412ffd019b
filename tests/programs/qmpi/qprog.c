/* The program of tests/tests/e2e/qmpi.rs, on 2 ranks, with known call
 * counts (the test mirrors them): it prints "READY <rank> <pid>", waits
 * for its go file when given one (argv[1]), then per rank:
 *   MPI_Comm_rank  1 + RANKS   (one before READY)
 *   MPI_Comm_size  1
 *   MPI_Send       SENDS on rank 0, none on rank 1
 *   MPI_Recv       SENDS on rank 1, none on rank 0
 *   MPI_Allreduce  REDUCES
 *   MPI_Barrier    BARRIERS
 *   MPI_Finalize   1
 * It checks every answer (a wrong one aborts) and prints "DONE <rank> ok".
 *
 * With QPROG_THREADS set, it initialises with MPI_THREAD_MULTIPLE and,
 * after the calls above, runs THREADS threads at once, each making
 * THREAD_ITERS MPI_Allreduce and as many MPI_Barrier on its own duplicate
 * of MPI_COMM_WORLD (MPI_Comm_dup and MPI_Comm_free, from the main thread,
 * come on top).
 *
 * With QPROG_LATE set, right after MPI_Init it registers a QMPI tool named
 * "late", which must be refused (the stack is built by then), and prints
 * "LATE <rank> rc=RC init=N": what QMPI_Register_tool_name returned and
 * how often the tool's init callback ran (it must not).
 *
 * Built with `mpicc $(mpi-observer qmpi-flags)`, which on Open MPI brings
 * the QMPI declarations and the stub library that lets it link; with
 * -DNO_QMPI it is an ordinary MPI program (no QMPI_LATE), built with the
 * plain `mpicc`. */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define SENDS 4
#define REDUCES 3
#define RANKS 2
#define BARRIERS 2
#define THREADS 4
#define THREAD_ITERS 5

static void check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "qprog: %s\n", what);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
}

static int late_inits;
#ifndef NO_QMPI
static void late_init(int id) {
    (void)id;
    late_inits++;
}
#endif

struct worker {
    pthread_t thread;
    MPI_Comm comm;
    int index, rank;
};

static void *work(void *arg) {
    struct worker *w = arg;
    for (int i = 0; i < THREAD_ITERS; i++) {
        int mine = w->rank + 100 * w->index + i, sum = -1;
        MPI_Allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, w->comm);
        check(sum == 1 + 2 * (100 * w->index + i), "a thread's MPI_Allreduce sum");
        MPI_Barrier(w->comm);
    }
    return NULL;
}

/* THREADS threads at once, each on its own communicator. */
static void threads(int rank) {
    struct worker w[THREADS];
    for (int t = 0; t < THREADS; t++) {
        w[t].index = t;
        w[t].rank = rank;
        MPI_Comm_dup(MPI_COMM_WORLD, &w[t].comm);
    }
    for (int t = 0; t < THREADS; t++)
        check(pthread_create(&w[t].thread, NULL, work, &w[t]) == 0, "pthread_create");
    for (int t = 0; t < THREADS; t++) {
        pthread_join(w[t].thread, NULL);
        MPI_Comm_free(&w[t].comm);
    }
}

int main(int argc, char **argv) {
    int rank, size, again, v, late_rc = 0;
    int threaded = getenv("QPROG_THREADS") != NULL;
    if (threaded) {
        int provided = -1;
        MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
        check(provided == MPI_THREAD_MULTIPLE, "MPI_THREAD_MULTIPLE");
    } else {
        MPI_Init(&argc, &argv);
    }
#ifndef NO_QMPI
    if (getenv("QPROG_LATE") != NULL)
        late_rc = QMPI_Register_tool_name("late", late_init);
#endif
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    check(size == 2, "run on 2 ranks");
    printf("READY %d %d\n", rank, (int)getpid());
    fflush(stdout);
    const char *go = argc > 1 ? argv[1] : NULL;
    while (go != NULL && access(go, F_OK) != 0)
        usleep(20000);

    for (int i = 0; i < SENDS; i++) {
        if (rank == 0) {
            MPI_Send(&i, 1, MPI_INT, 1, i, MPI_COMM_WORLD);
        } else {
            MPI_Recv(&v, 1, MPI_INT, 0, i, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            check(v == i, "MPI_Recv payload");
        }
    }
    for (int i = 0; i < REDUCES; i++) {
        int mine = rank + 10 * i, sum = -1;
        MPI_Allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        check(sum == 1 + 20 * i, "MPI_Allreduce sum");
    }
    for (int i = 0; i < RANKS; i++) {
        MPI_Comm_rank(MPI_COMM_WORLD, &again);
        check(again == rank, "MPI_Comm_rank");
    }
    for (int i = 0; i < BARRIERS; i++)
        MPI_Barrier(MPI_COMM_WORLD);
    if (threaded)
        threads(rank);

    if (getenv("QPROG_LATE") != NULL)
        printf("LATE %d rc=%d init=%d\n", rank, late_rc, late_inits);
    printf("DONE %d ok\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
