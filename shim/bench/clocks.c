/* What one clock read costs, for `cargo xtask bench shim`: ns per read of
 * N back-to-back reads of the time-stamp counter (rdtsc, what `stats`
 * times calls with) and of CLOCK_MONOTONIC through the vDSO (its fallback),
 * timed with clock_gettime around the loop. Prints the median of LOOPS. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <x86intrin.h>

#define N 10000000
#define LOOPS 3

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(void) {
    double tsc[LOOPS], mono[LOOPS];
    unsigned long long sink = 0;
    for (int k = 0; k < LOOPS; k++) {
        double t0 = now();
        for (int i = 0; i < N; i++)
            sink += __rdtsc();
        tsc[k] = (now() - t0) / N;
    }
    for (int k = 0; k < LOOPS; k++) {
        double t0 = now();
        for (int i = 0; i < N; i++) {
            struct timespec t;
            clock_gettime(CLOCK_MONOTONIC, &t);
            sink += (unsigned long long)t.tv_nsec;
        }
        mono[k] = (now() - t0) / N;
    }
    qsort(tsc, LOOPS, sizeof tsc[0], cmp);
    qsort(mono, LOOPS, sizeof mono[0], cmp);
    printf("bench rdtsc_ns=%.2f clock_gettime_ns=%.2f sink=%llu\n", tsc[LOOPS / 2],
           mono[LOOPS / 2], sink & 1);
    return 0;
}
