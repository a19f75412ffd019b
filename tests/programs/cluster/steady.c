/* A paced MPI job for the multi-node dashboard test (tests/tests/cluster.rs).
 *
 * usage: steady ITER GOFILE STOPFILE
 * Every rank prints "READY <rank> <pid>" and waits (without MPI calls) for
 * GOFILE. It then runs ITER iterations; each makes exactly one call per rank
 * of MPI_Isend, MPI_Irecv, MPI_Waitall, MPI_Allreduce, MPI_Bcast,
 * MPI_Alltoall and MPI_Barrier, after a short "compute" sleep that grows with
 * the rank, so low ranks wait in collectives for high ranks: a known
 * imbalance for the dashboards to show.
 * Then each rank posts one MPI_Irecv that stays outstanding, prints
 * "DONE <rank>" and holds (no MPI calls) until STOPFILE exists, so the test
 * can query Prometheus while the job runs and every counter is final and
 * a request is outstanding. Finally one MPI_Send satisfies the held receive,
 * one MPI_Wait completes it, the rank checks every result, prints "OK <rank>"
 * and calls MPI_Finalize.
 *
 * Per rank in total: Isend ITER, Irecv ITER+1, Waitall ITER, Allreduce ITER,
 * Bcast ITER, Alltoall ITER, Barrier ITER, Send 1, Wait 1, Finalize 1. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define N1 16 /* ints, Isend/Irecv ring: 64 bytes */
#define N2 4  /* doubles, Allreduce: 32 bytes */
#define N3 8  /* ints, Bcast: 32 bytes */

static void wait_file(const char *path) {
    while (access(path, F_OK) != 0)
        usleep(20000);
}

static void fail(const char *what, int rank, int iter) {
    fprintf(stderr, "WRONG %s rank %d iter %d\n", what, rank, iter);
    MPI_Abort(MPI_COMM_WORLD, 3);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc != 4) {
        fprintf(stderr, "usage: steady ITER GOFILE STOPFILE\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int iters = atoi(argv[1]);
    printf("READY %d %d\n", rank, (int)getpid());
    fflush(stdout);
    wait_file(argv[2]);

    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    int *to = malloc(sizeof(int) * size), *from = malloc(sizeof(int) * size);
    for (int it = 0; it < iters; it++) {
        usleep(200 * (rank + 1));

        int sbuf[N1], rbuf[N1];
        for (int i = 0; i < N1; i++) sbuf[i] = rank * 1000 + it + i;
        MPI_Request req[2];
        MPI_Isend(sbuf, N1, MPI_INT, right, 1, MPI_COMM_WORLD, &req[0]);
        MPI_Irecv(rbuf, N1, MPI_INT, left, 1, MPI_COMM_WORLD, &req[1]);
        MPI_Waitall(2, req, MPI_STATUSES_IGNORE);
        if (rbuf[N1 - 1] != left * 1000 + it + N1 - 1) fail("ring", rank, it);

        double a[N2], s[N2];
        for (int i = 0; i < N2; i++) a[i] = rank + i;
        MPI_Allreduce(a, s, N2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        if (s[1] != size * (size - 1) / 2.0 + size) fail("allreduce", rank, it);

        int b[N3];
        if (rank == 0)
            for (int i = 0; i < N3; i++) b[i] = it * 3 + i;
        MPI_Bcast(b, N3, MPI_INT, 0, MPI_COMM_WORLD);
        if (b[N3 - 1] != it * 3 + N3 - 1) fail("bcast", rank, it);

        for (int i = 0; i < size; i++) to[i] = rank * 100 + i + it;
        MPI_Alltoall(to, 1, MPI_INT, from, 1, MPI_INT, MPI_COMM_WORLD);
        if (from[size - 1] != (size - 1) * 100 + rank + it) fail("alltoall", rank, it);

        MPI_Barrier(MPI_COMM_WORLD);
    }

    int held = -1, token = rank;
    MPI_Request hreq;
    MPI_Irecv(&held, 1, MPI_INT, left, 9, MPI_COMM_WORLD, &hreq);
    printf("DONE %d\n", rank);
    fflush(stdout);
    wait_file(argv[3]);
    MPI_Send(&token, 1, MPI_INT, right, 9, MPI_COMM_WORLD);
    MPI_Wait(&hreq, MPI_STATUS_IGNORE);
    if (held != left) fail("held", rank, iters);
    free(to);
    free(from);
    printf("OK %d\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
