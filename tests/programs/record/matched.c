/* A job for tests/tests/trace_rings.rs: the receives `traffic.c` does not
 * make, recorded through the shim's rings.
 *
 * usage: matched ITERS GOFILE
 * Every rank prints "READY <rank> <pid>"; rank 0 waits for GOFILE while the
 * others wait in MPI_Barrier. Then, ITERS times, each rank r, with
 * right = r+1 and left = r-1 (mod size):
 *  1. matched blocking: MPI_Isend to right (tag 1); MPI_Mprobe from
 *     MPI_ANY_SOURCE, MPI_Mrecv; MPI_Wait on the send;
 *  2. matched nonblocking: MPI_Isend to right (tag 2); MPI_Probe, then
 *     MPI_Improbe from left (until it matches), MPI_Imrecv, MPI_Waitall
 *     (statuses ignored);
 *  3. MPI_Sendrecv to right from left (tag 3);
 *  4. nothing: MPI_Send to and MPI_Irecv + MPI_Wait from MPI_PROC_NULL.
 * Per iteration each rank sends 3 messages to right and receives 3 from
 * left. Each rank checks every value it received, prints "OK <rank>" and
 * finalizes; a wrong value aborts. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define N 32

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
        fprintf(stderr, "usage: matched ITERS GOFILE\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int iters = atoi(argv[1]);
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    int out[N], in[N];

    printf("READY %d %d\n", rank, (int)getpid());
    fflush(stdout);
    if (rank == 0)
        while (access(argv[2], F_OK) != 0)
            usleep(10000);
    MPI_Barrier(MPI_COMM_WORLD);

    for (int it = 0; it < iters; it++) {
        int v = rank * 1000 + it, lv = left * 1000 + it;
        for (int i = 0; i < N; i++) out[i] = v + i;

        MPI_Request r[2];
        MPI_Message m;
        MPI_Status st;
        MPI_Isend(out, N, MPI_INT, right, 1, MPI_COMM_WORLD, &r[0]);
        MPI_Mprobe(MPI_ANY_SOURCE, 1, MPI_COMM_WORLD, &m, &st);
        check(st.MPI_SOURCE == left, "mprobe source", rank, it);
        MPI_Mrecv(in, N, MPI_INT, &m, MPI_STATUS_IGNORE);
        MPI_Wait(&r[0], MPI_STATUS_IGNORE);
        check(in[N - 1] == lv + N - 1, "mrecv", rank, it);

        MPI_Isend(out, N, MPI_INT, right, 2, MPI_COMM_WORLD, &r[0]);
        /* MPI_Probe first, so MPI_Improbe matches at once and the ring
         * does not fill with a spin loop's calls. */
        MPI_Probe(left, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        int flag = 0;
        while (!flag)
            MPI_Improbe(left, 2, MPI_COMM_WORLD, &flag, &m, MPI_STATUS_IGNORE);
        MPI_Imrecv(in, N, MPI_INT, &m, &r[1]);
        MPI_Waitall(2, r, MPI_STATUSES_IGNORE);
        check(in[0] == lv, "imrecv", rank, it);

        MPI_Sendrecv(out, N, MPI_INT, right, 3, in, N, MPI_INT, left, 3, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        check(in[1] == lv + 1, "sendrecv", rank, it);

        MPI_Send(out, N, MPI_INT, MPI_PROC_NULL, 4, MPI_COMM_WORLD);
        MPI_Irecv(in, N, MPI_INT, MPI_PROC_NULL, 4, MPI_COMM_WORLD, &r[0]);
        MPI_Wait(&r[0], MPI_STATUS_IGNORE);
    }
    printf("OK %d\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
