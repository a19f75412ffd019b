/* MPI_Comm_rank from several threads at once (MPI_THREAD_MULTIPLE), for
 * tests/tests/kmaps.rs: the probes of every thread add to the same shared
 * statistics entry with atomic adds, so the count must be exact.
 *
 * usage: threads T N GOFILE
 * Every rank prints "READY <rank> <pid>" and waits (without MPI calls) for
 * GOFILE. Then T threads each call MPI_Comm_rank N times, all released at
 * once, checking every answer; the rank prints "OK <rank> <T*N> ns=<CPU ns
 * per call, mean over threads> wall=<wall ns per call of one thread>" or
 * exits non-zero (`cargo xtask bench kmaps` reads the times). */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static long n_calls;
static int my_rank;
static pthread_barrier_t start;

struct work {
    long done;
    double cpu_ns;
};

static double now_ns(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static void *worker(void *arg) {
    struct work *w = arg;
    long *done = &w->done;
    pthread_barrier_wait(&start);
    double c0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
    for (long i = 0; i < n_calls; i++) {
        int r = -1;
        MPI_Comm_rank(MPI_COMM_WORLD, &r);
        if (r != my_rank) {
            fprintf(stderr, "WRONG rank %d != %d\n", r, my_rank);
            exit(3);
        }
        (*done)++;
    }
    w->cpu_ns = now_ns(CLOCK_THREAD_CPUTIME_ID) - c0;
    return NULL;
}

int main(int argc, char **argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &my_rank);
    if (argc < 4 || provided != MPI_THREAD_MULTIPLE) {
        fprintf(stderr, "usage: threads T N GOFILE (needs MPI_THREAD_MULTIPLE, got %d)\n",
                provided);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int t = atoi(argv[1]);
    n_calls = atol(argv[2]);
    if (t < 1 || t > 64) MPI_Abort(MPI_COMM_WORLD, 2);
    printf("READY %d %d\n", my_rank, (int)getpid());
    fflush(stdout);
    while (access(argv[3], F_OK) != 0) usleep(20000);

    pthread_t th[64];
    static struct work w[64];
    pthread_barrier_init(&start, NULL, (unsigned)t);
    double w0 = now_ns(CLOCK_MONOTONIC);
    for (int i = 0; i < t; i++) pthread_create(&th[i], NULL, worker, &w[i]);
    long total = 0;
    double cpu = 0;
    for (int i = 0; i < t; i++) {
        pthread_join(th[i], NULL);
        total += w[i].done;
        cpu += w[i].cpu_ns;
    }
    double wall = now_ns(CLOCK_MONOTONIC) - w0;
    printf("OK %d %ld ns=%.1f wall=%.1f\n", my_rank, total, cpu / (double)total,
           wall / (double)n_calls);
    fflush(stdout);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return 0;
}
