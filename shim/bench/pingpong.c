/* 8-byte ping-pong between ranks 0 and 1: one-way latency in ns, the
 * fastest and the median of REPS timed blocks of ROUNDS round trips (other
 * work on the machine only ever adds time). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define ROUNDS 20000
#define REPS 9

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void block(int rank, int rounds) {
    long msg = 0;
    for (int i = 0; i < rounds; i++) {
        if (rank == 0) {
            MPI_Send(&msg, 8, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
            MPI_Recv(&msg, 8, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(&msg, 8, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(&msg, 8, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
        }
    }
}

int main(int argc, char **argv) {
    int rank;
    double ns[REPS];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    block(rank, ROUNDS / 4); /* warm up */
    for (int k = 0; k < REPS; k++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        block(rank, ROUNDS);
        ns[k] = (MPI_Wtime() - t0) * 1e9 / (2.0 * ROUNDS);
    }
    qsort(ns, REPS, sizeof ns[0], cmp);
    if (rank == 0)
        printf("bench pingpong_ns=%.1f pingpong_median_ns=%.1f\n", ns[0], ns[REPS / 2]);
    MPI_Finalize();
    return 0;
}
