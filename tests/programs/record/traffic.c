/* A job for `mpi-observer record`'s end-to-end test (tests/tests/record.rs):
 * every kind of point-to-point traffic the OTF2 event model has, with
 * counts the test computes, on any number of ranks.
 *
 * usage: traffic ITERS GOFILE
 * Every rank prints "READY <rank> <pid>"; rank 0 waits for GOFILE while the
 * others wait in MPI_Barrier (a call the recording starts inside). Then,
 * ITERS times, each rank r, with right = r+1 and left = r-1 (mod size):
 *  1. blocking: MPI_Send to right, MPI_Recv from left (tag 1), rank 0
 *     sending first so the ring cannot deadlock;
 *  2. nonblocking: MPI_Irecv from left, MPI_Isend to right (tag 2),
 *     MPI_Waitall;
 *  3. persistent: MPI_Recv_init/MPI_Send_init made once, MPI_Startall and
 *     MPI_Waitall each iteration (tag 3, right);
 *  4. wildcard: every rank but 0 sends to 0 (tag 4); rank 0 receives them
 *     with MPI_ANY_SOURCE and MPI_ANY_TAG;
 *  5. a communicator with the world's ranks reversed (MPI_Comm_split): a
 *     MPI_Sendrecv to the next rank in it (tag 5), that is world rank r-1;
 *  6. MPI_Allreduce, and MPI_Bcast from root 1 % size.
 * Each rank checks every value it received, prints "OK <rank>" and
 * finalizes; a wrong value aborts. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define N 64

static void check(int ok, const char *what, int rank, int it) {
    if (!ok) {
        fprintf(stderr, "WRONG %s rank %d iter %d\n", what, rank, it);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc != 3) {
        fprintf(stderr, "usage: traffic ITERS GOFILE\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int iters = atoi(argv[1]);
    MPI_Comm rev;
    MPI_Comm_split(MPI_COMM_WORLD, 0, size - rank, &rev);
    int rrank, rsize;
    MPI_Comm_rank(rev, &rrank);
    MPI_Comm_size(rev, &rsize);
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    int out[N], in[N], pin[N], pout[N];
    MPI_Request pers[2];
    MPI_Recv_init(pin, N, MPI_INT, left, 3, MPI_COMM_WORLD, &pers[0]);
    MPI_Send_init(pout, N, MPI_INT, right, 3, MPI_COMM_WORLD, &pers[1]);

    printf("READY %d %d\n", rank, (int)getpid());
    fflush(stdout);
    if (rank == 0)
        while (access(argv[2], F_OK) != 0)
            usleep(10000);
    MPI_Barrier(MPI_COMM_WORLD);

    for (int it = 0; it < iters; it++) {
        int v = rank * 1000 + it, lv = left * 1000 + it;
        for (int i = 0; i < N; i++) out[i] = v + i;
        if (rank == 0) {
            MPI_Send(out, N, MPI_INT, right, 1, MPI_COMM_WORLD);
            MPI_Recv(in, N, MPI_INT, left, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(in, N, MPI_INT, left, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(out, N, MPI_INT, right, 1, MPI_COMM_WORLD);
        }
        check(in[N - 1] == lv + N - 1, "blocking", rank, it);

        MPI_Request r[2];
        MPI_Irecv(in, N, MPI_INT, left, 2, MPI_COMM_WORLD, &r[0]);
        MPI_Isend(out, N, MPI_INT, right, 2, MPI_COMM_WORLD, &r[1]);
        MPI_Waitall(2, r, MPI_STATUSES_IGNORE);
        check(in[0] == lv, "nonblocking", rank, it);

        for (int i = 0; i < N; i++) pout[i] = v + 2 * i;
        MPI_Startall(2, pers);
        MPI_Waitall(2, pers, MPI_STATUSES_IGNORE);
        check(pin[N - 1] == lv + 2 * (N - 1), "persistent", rank, it);

        if (rank == 0) {
            int seen = 0;
            for (int k = 1; k < size; k++) {
                int x;
                MPI_Status st;
                MPI_Recv(&x, 1, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
                check(x == st.MPI_SOURCE * 1000 + it && st.MPI_TAG == 4, "wildcard", rank, it);
                seen++;
            }
            check(seen == size - 1, "wildcard count", rank, it);
        } else {
            MPI_Send(&v, 1, MPI_INT, 0, 4, MPI_COMM_WORLD);
        }

        int got = -1;
        MPI_Sendrecv(&v, 1, MPI_INT, (rrank + 1) % rsize, 5, &got, 1, MPI_INT,
                     (rrank + rsize - 1) % rsize, 5, rev, MPI_STATUS_IGNORE);
        check(got == right * 1000 + it, "split", rank, it);

        int sum = 0, b = rank == 1 % size ? it : -1;
        MPI_Allreduce(&v, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Bcast(&b, 1, MPI_INT, 1 % size, MPI_COMM_WORLD);
        check(b == it && sum == 1000 * size * (size - 1) / 2 + size * it, "collectives", rank, it);
    }
    MPI_Request_free(&pers[0]);
    MPI_Request_free(&pers[1]);
    MPI_Comm_free(&rev);
    printf("OK %d\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
