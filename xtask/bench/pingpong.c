/* pingpong: one-way latency between ranks 0 and 1, for
 * `cargo xtask bench observer`.
 *
 *   pingpong DIR
 *
 * Each rank writes DIR/pid.RANK after MPI_Init and waits for DIR/go, so the
 * observer can attach first. Rank 0 then prints "lat8=US lat1m=US": the
 * median over batches of half the round-trip time, in microseconds, for
 * 8-byte and 1 MiB messages, and "best8=US best1m=US", the fastest batch's
 * (the least disturbed by other load on the machine), and "csw8=N", the
 * context switches rank 0 went through during the 8-byte part. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define BATCHES 15

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pingpong(int rank, char *buf, int bytes, int iters)
{
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++) {
        if (rank == 0) {
            MPI_Send(buf, bytes, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
            MPI_Recv(buf, bytes, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (rank == 1) {
            MPI_Recv(buf, bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(buf, bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
        }
    }
    return (MPI_Wtime() - t0) / (2.0 * iters) * 1e6;
}

/* Median and fastest batch. */
static void latency_us(int rank, char *buf, int bytes, int iters, double *med, double *best)
{
    double v[BATCHES];
    pingpong(rank, buf, bytes, iters / 4 + 1); /* warm-up */
    for (int b = 0; b < BATCHES; b++)
        v[b] = pingpong(rank, buf, bytes, iters);
    qsort(v, BATCHES, sizeof(double), cmp);
    *med = v[BATCHES / 2];
    *best = v[0];
}

int main(int argc, char **argv)
{
    int rank;
    char path[4096];
    if (argc < 2) {
        fprintf(stderr, "usage: pingpong DIR\n");
        return 2;
    }
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    snprintf(path, sizeof path, "%s/pid.%d", argv[1], rank);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    fprintf(f, "%d\n", (int)getpid());
    fclose(f);
    snprintf(path, sizeof path, "%s/go", argv[1]);
    while (access(path, F_OK) != 0)
        usleep(2000);
    MPI_Barrier(MPI_COMM_WORLD);
    char *buf = calloc(1, 1 << 20);
    double l8, b8, l1m, b1m;
    struct rusage r0, r1;
    getrusage(RUSAGE_SELF, &r0);
    latency_us(rank, buf, 8, 2000, &l8, &b8);
    getrusage(RUSAGE_SELF, &r1);
    long csw = (r1.ru_nvcsw - r0.ru_nvcsw) + (r1.ru_nivcsw - r0.ru_nivcsw);
    latency_us(rank, buf, 1 << 20, 40, &l1m, &b1m);
    if (rank == 0)
        printf("lat8=%.2f lat1m=%.2f best8=%.2f best1m=%.2f csw8=%ld\n", l8, l1m, b8, b1m, csw);
    free(buf);
    MPI_Finalize();
    return 0;
}
