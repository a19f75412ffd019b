/* probecost: nanoseconds per call of cheap PMPI functions, for
 * `cargo xtask bench observer`.
 *
 *   probecost GO_FILE BATCHES CALLS FUNC...
 *
 * FUNC is comm_rank, wtime, wtick or query_thread. After MPI_Init it prints
 * "ready pid=N" and waits for GO_FILE to exist (so probes go in first). Each
 * batch then runs CALLS calls of every FUNC in turn, so drift hits them all
 * alike, and the program prints "FUNC=NS" with the median over batches of
 * wall-clock ns per call, and "FUNC_cpu=NS" with the same in the thread's
 * CPU time (user + system, so the probe's trap is in it, but time spent
 * descheduled by other load on the machine is not). It prints "done" and waits for GO_FILE to be removed before
 * MPI_Finalize, so the observer can be scraped while the rank still lives.
 * The PMPI names are called directly: they are where the probes sit. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile double sink_d;
static volatile int sink_i;

static double now_ns(clockid_t c)
{
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static void run(const char *f, long calls)
{
    int v;
    if (!strcmp(f, "comm_rank"))
        for (long i = 0; i < calls; i++) {
            PMPI_Comm_rank(MPI_COMM_WORLD, &v);
            sink_i = v;
        }
    else if (!strcmp(f, "wtime"))
        for (long i = 0; i < calls; i++)
            sink_d = PMPI_Wtime();
    else if (!strcmp(f, "wtick"))
        for (long i = 0; i < calls; i++)
            sink_d = PMPI_Wtick();
    else if (!strcmp(f, "test")) {
        /* Open MPI's MPI_Test starts with a RIP-relative load the observer
         * probes past (mpi-observer sites: "emulated(+7)"). */
        MPI_Request r = MPI_REQUEST_NULL;
        for (long i = 0; i < calls; i++) {
            PMPI_Test(&r, &v, MPI_STATUS_IGNORE);
            sink_i = v;
        }
    } else if (!strcmp(f, "query_thread"))
        for (long i = 0; i < calls; i++) {
            PMPI_Query_thread(&v);
            sink_i = v;
        }
    else {
        fprintf(stderr, "probecost: unknown function %s\n", f);
        exit(2);
    }
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: probecost GO_FILE BATCHES CALLS FUNC...\n");
        return 2;
    }
    const char *go = argv[1];
    int batches = atoi(argv[2]);
    long calls = atol(argv[3]);
    int nf = argc - 4;
    MPI_Init(&argc, &argv);
    printf("ready pid=%d\n", (int)getpid());
    fflush(stdout);
    while (access(go, F_OK) != 0)
        usleep(2000);
    size_t n = (size_t)(batches > 0 ? batches : 1) * (nf > 0 ? nf : 1);
    double *ns = malloc(sizeof(double) * n), *cpu = malloc(sizeof(double) * n);
    for (int k = 0; k < nf; k++)
        run(argv[4 + k], calls / 10); /* warm-up */
    for (int b = 0; b < batches; b++)
        for (int k = 0; k < nf; k++) {
            double c0 = now_ns(CLOCK_THREAD_CPUTIME_ID), t0 = now_ns(CLOCK_MONOTONIC);
            run(argv[4 + k], calls);
            ns[k * batches + b] = (now_ns(CLOCK_MONOTONIC) - t0) / calls;
            cpu[k * batches + b] = (now_ns(CLOCK_THREAD_CPUTIME_ID) - c0) / calls;
        }
    for (int k = 0; k < nf && batches > 0; k++) {
        qsort(ns + k * batches, batches, sizeof(double), cmp);
        qsort(cpu + k * batches, batches, sizeof(double), cmp);
        printf("%s=%.1f\n", argv[4 + k], ns[k * batches + batches / 2]);
        printf("%s_cpu=%.1f\n", argv[4 + k], cpu[k * batches + batches / 2]);
    }
    printf("done\n");
    fflush(stdout);
    while (access(go, F_OK) == 0)
        usleep(2000);
    free(ns);
    free(cpu);
    MPI_Finalize();
    return 0;
}
