/* ns per MPI_Comm_rank call: the cheapest MPI call, so the layering's cost
 * is not hidden. Prints the fastest and the median of REPS timed loops of
 * CALLS calls: other work on the machine only ever adds time, so the
 * fastest loop is the least disturbed measurement. argv[1], if given,
 * replaces CALLS (a dearer configuration needs fewer calls to be timed
 * as well). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CALLS 2000000
#define REPS 9

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int r = 0, sink = 0;
    int calls = argc > 1 ? atoi(argv[1]) : CALLS;
    double ns[REPS];
    MPI_Init(&argc, &argv);
    for (int i = 0; i < calls / 10; i++) /* warm up: first call builds the stack */
        MPI_Comm_rank(MPI_COMM_WORLD, &r), sink += r;
    for (int k = 0; k < REPS; k++) {
        double t0 = now();
        for (int i = 0; i < calls; i++) {
            MPI_Comm_rank(MPI_COMM_WORLD, &r);
            sink += r;
        }
        ns[k] = (now() - t0) / calls;
    }
    qsort(ns, REPS, sizeof ns[0], cmp);
    printf("bench dispatch_ns=%.3f dispatch_median_ns=%.3f sink=%d\n", ns[0], ns[REPS / 2], sink);
    MPI_Finalize();
    return 0;
}
