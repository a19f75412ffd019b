/* 8-byte blocking ping-pong between ranks 0 and 1 for `cargo xtask bench
 * shim`: one-way latency in ns, the median and the fastest of BATCHES timed
 * batches of round trips (argv[2], default 2000, after a warm-up). Short
 * batches, many of them: on a shared machine a descheduled rank stalls
 * its partner for a time slice, and the median batch is one that no such
 * stall hit.
 *
 * argv[1] is a directory. Each rank writes its pid to DIR/pid.RANK, then
 * waits for DIR/go, making an MPI_Iprobe every millisecond: a call where
 * `mpi-observer attach --inject` can stop the rank and inject the shim.
 * The bench creates DIR/go only once the daemon has reported the shim live
 * in both ranks (and the probes' links are closed), so an injected run's
 * timed batches run entirely on the injected shim.
 *
 * With BENCH_PERF_CTL set to a directory, the rank runs under `perf record
 * -D -1 --control fifo:DIR/ctl.PPID` (perf is its parent) and turns the
 * profile on for the timed batches only, so start-up and the wait are not
 * in it. */
#include <fcntl.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BATCHES 101

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One-way ns: half the round trip. */
static double batch(int rank, int iters) {
    long msg = 0;
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++) {
        if (rank == 0) {
            MPI_Send(&msg, 8, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
            MPI_Recv(&msg, 8, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(&msg, 8, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(&msg, 8, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
        }
    }
    return (MPI_Wtime() - t0) / (2.0 * iters) * 1e9;
}

/* Sends `cmd` to the perf record that is this process's parent, and waits
 * for its acknowledgement, so no sample of the timed part is missed. */
static void perf_ctl(const char *cmd) {
    const char *dir = getenv("BENCH_PERF_CTL");
    char path[4096], ack[16];
    if (!dir)
        return;
    snprintf(path, sizeof path, "%s/ctl.%d", dir, (int)getppid());
    int fd = open(path, O_WRONLY);
    snprintf(path, sizeof path, "%s/ack.%d", dir, (int)getppid());
    int afd = open(path, O_RDONLY);
    if (fd < 0 || afd < 0 || write(fd, cmd, strlen(cmd)) != (ssize_t)strlen(cmd) ||
        read(afd, ack, sizeof ack) <= 0) {
        fprintf(stderr, "pingpong: cannot reach perf through %s/ctl.%d\n", dir, (int)getppid());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    close(fd);
    close(afd);
}

int main(int argc, char **argv) {
    int rank, flag;
    char path[4096];
    if (argc < 2) {
        fprintf(stderr, "usage: pingpong DIR [ROUND_TRIPS_PER_BATCH]\n");
        return 2;
    }
    int iters = argc > 2 ? atoi(argv[2]) : 2000;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    snprintf(path, sizeof path, "%s/pid.%d", argv[1], rank);
    FILE *f = fopen(path, "w");
    if (!f)
        MPI_Abort(MPI_COMM_WORLD, 1);
    fprintf(f, "%d\n", (int)getpid());
    fclose(f);
    snprintf(path, sizeof path, "%s/go", argv[1]);
    while (access(path, F_OK) != 0) {
        MPI_Iprobe(MPI_ANY_SOURCE, 99, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
        usleep(1000);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    batch(rank, iters / 4 + 1); /* warm up */
    double v[BATCHES];
    perf_ctl("enable\n");
    for (int b = 0; b < BATCHES; b++)
        v[b] = batch(rank, iters);
    perf_ctl("disable\n");
    qsort(v, BATCHES, sizeof v[0], cmp);
    if (rank == 0)
        printf("bench lat8_ns=%.1f fastest_ns=%.1f round_trips=%d\n", v[BATCHES / 2], v[0],
               BATCHES * iters);
    MPI_Finalize();
    return 0;
}
