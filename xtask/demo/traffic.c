/* The demo's MPI job: about 20 s of mixed traffic on 4 ranks.
 *
 * Each step does a ring exchange (Isend/Irecv/Waitall), a halo Sendrecv,
 * an Allreduce, and every 10th step a Bcast, an Alltoall and a Barrier.
 * Rank 3 computes eight times as long each step, so the others wait for
 * it: in the collectives, and rank 0 for its ring message. The live table
 * shows that imbalance as MPI time; under the shim's stats layer the
 * report names rank 3 as the rank that makes the others wait.
 * usage: traffic [SECONDS] (arguments after it are ignored) */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* Seconds of this thread's CPU time. */
static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* A step's computation: 1.5 ms of CPU on ranks 0-2, 12 ms on rank 3.
 * Counted in CPU time, not iterations, so the imbalance is the same on a
 * fast CPU and a slow one; and far above the scheduler's time slice, so
 * that on a node with fewer cores than ranks, where a busy-polling MPI
 * (MPICH) keeps every core taken, the imbalance, not which rank the
 * machine happened to deschedule, is what the report finds. */
static double work(int rank, int step) {
    double x = 0, until = cpu_seconds() + (rank == 3 ? 12e-3 : 1.5e-3);
    do {
        for (long i = 0; i < 20000; i++) x += (double)((i ^ step) & 7) * 1e-9;
    } while (cpu_seconds() < until);
    return x;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    double seconds = argc > 1 ? atof(argv[1]) : 20.0;
    printf("READY %d %d\n", rank, (int)getpid());
    fflush(stdout);
    enum { N = 4096 };
    static double a[N], b[N], halo_out[256], halo_in[256];
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    double t0 = MPI_Wtime(), acc = 0;
    int stop = 0, step = 0;
    while (!stop) {
        acc += work(rank, step);
        MPI_Request r[2];
        MPI_Isend(a, N, MPI_DOUBLE, right, 0, MPI_COMM_WORLD, &r[0]);
        MPI_Irecv(b, N, MPI_DOUBLE, left, 0, MPI_COMM_WORLD, &r[1]);
        MPI_Waitall(2, r, MPI_STATUSES_IGNORE);
        MPI_Sendrecv(halo_out, 256, MPI_DOUBLE, right, 1, halo_in, 256, MPI_DOUBLE, left, 1,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        double local = acc, global;
        MPI_Allreduce(&local, &global, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        if (step % 10 == 0) {
            int cfg[16] = {step};
            MPI_Bcast(cfg, 16, MPI_INT, 0, MPI_COMM_WORLD);
            int out[64], in[64];
            for (int i = 0; i < 64; i++) out[i] = rank;
            MPI_Alltoall(out, 64 / size, MPI_INT, in, 64 / size, MPI_INT, MPI_COMM_WORLD);
            MPI_Barrier(MPI_COMM_WORLD);
        }
        if (rank == 0) stop = MPI_Wtime() - t0 >= seconds;
        MPI_Bcast(&stop, 1, MPI_INT, 0, MPI_COMM_WORLD);
        step++;
    }
    printf("DONE rank %d: %d steps in %.1f s\n", rank, step, MPI_Wtime() - t0);
    MPI_Finalize();
    return 0;
}
