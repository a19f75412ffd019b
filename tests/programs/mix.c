/* A known mix of MPI calls for exact-count tests.
 *
 * usage: mix ITER GOFILE
 * Every rank prints "READY <rank> <pid>", then waits (without MPI calls)
 * until GOFILE exists, then runs ITER iterations of the counted phase, checks
 * every result it received, and prints "OK <rank>" or exits non-zero.
 * With MIX_POLL set, the wait makes an MPI_Iprobe call every 2 ms, so a
 * daemon can inject the shim at one of them (tests/tests/inject.rs).
 * With MIX_STOP=PATH, ITER is only a cap: the phase ends after the round in
 * which rank 0 sees PATH exist, so a test can act in the middle of it
 * however fast the machine is. Rank 0 says so in the round's own Bcast
 * (b[0], which no rank checks otherwise): no call is added to a round.
 * The expected per-rank counts are documented in tests/tests/observer.rs. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N1 16   /* ints, Isend/Irecv */
#define N2 8    /* doubles, Sendrecv */
#define N3 100  /* chars, Send/Recv 0 -> 1 */
#define N4 32   /* ints, Bcast */
#define N5 4    /* doubles, Allreduce */

static void fail(const char *what, int rank, int iter) {
    fprintf(stderr, "WRONG %s rank %d iter %d\n", what, rank, iter);
    MPI_Abort(MPI_COMM_WORLD, 3);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int iters = argc > 1 ? atoi(argv[1]) : 10;
    const char *go = argc > 2 ? argv[2] : NULL;
    printf("READY %d %d\n", rank, (int)getpid());
    fflush(stdout);
    int poll = getenv("MIX_POLL") != NULL;
    const char *stop = getenv("MIX_STOP");
    while (go && access(go, F_OK) != 0) {
        if (poll) {
            int flag;
            MPI_Iprobe(MPI_ANY_SOURCE, 999, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
            usleep(2000);
        } else {
            usleep(20000);
        }
    }

    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    MPI_Datatype triple;
    MPI_Type_contiguous(3, MPI_INT, &triple);
    MPI_Type_commit(&triple);

    for (int it = 0; it < iters; it++) {
        int sbuf[N1], rbuf[N1];
        for (int i = 0; i < N1; i++) sbuf[i] = rank * 1000 + it + i;
        MPI_Request req[2];
        MPI_Isend(sbuf, N1, MPI_INT, right, 1, MPI_COMM_WORLD, &req[0]);
        MPI_Irecv(rbuf, N1, MPI_INT, left, 1, MPI_COMM_WORLD, &req[1]);
        MPI_Waitall(2, req, MPI_STATUSES_IGNORE);
        if (rbuf[N1 - 1] != left * 1000 + it + N1 - 1) fail("isend", rank, it);

        double d[N2], e[N2];
        for (int i = 0; i < N2; i++) d[i] = rank + i * 0.5;
        MPI_Sendrecv(d, N2, MPI_DOUBLE, right, 2, e, N2, MPI_DOUBLE, left, 2, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        if (e[1] != left + 0.5) fail("sendrecv", rank, it);

        char c[N3];
        if (rank == 0) {
            memset(c, 'x', N3);
            MPI_Send(c, N3, MPI_CHAR, 1, 3, MPI_COMM_WORLD);
        } else if (rank == 1) {
            MPI_Recv(c, N3, MPI_CHAR, 0, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            if (c[N3 - 1] != 'x') fail("recv", rank, it);
        }

        /* A derived datatype: 2 triples = 6 ints = 24 bytes. */
        int t[6];
        if (rank == 0) {
            for (int i = 0; i < 6; i++) t[i] = it + i;
            MPI_Ssend(t, 2, triple, 2, 4, MPI_COMM_WORLD);
        } else if (rank == 2) {
            MPI_Recv(t, 6, MPI_INT, 0, 4, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            if (t[5] != it + 5) fail("derived", rank, it);
        }

        int b[N4];
        if (rank == 0) for (int i = 0; i < N4; i++) b[i] = it * 7 + i;
        if (rank == 0 && stop) b[0] = access(stop, F_OK) == 0 ? -1 : 0;
        MPI_Bcast(b, N4, MPI_INT, 0, MPI_COMM_WORLD);
        if (b[N4 - 1] != it * 7 + N4 - 1) fail("bcast", rank, it);
        if (stop && b[0] == -1) iters = it + 1; /* this round is the last */

        double a[N5], s[N5];
        for (int i = 0; i < N5; i++) a[i] = rank + i;
        MPI_Allreduce(a, s, N5, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        if (s[1] != size * (size - 1) / 2.0 + size) fail("allreduce", rank, it);

        double one = 1.0, total = 0.0;
        MPI_Reduce(&one, &total, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        if (rank == 0 && total != size) fail("reduce", rank, it);

        MPI_Barrier(MPI_COMM_WORLD);

        int mine = rank + it, *all = malloc(sizeof(int) * size);
        MPI_Gather(&mine, 1, MPI_INT, all, 1, MPI_INT, 0, MPI_COMM_WORLD);
        if (rank == 0 && all[size - 1] != size - 1 + it) fail("gather", rank, it);

        int *to = malloc(sizeof(int) * 2 * size), *from = malloc(sizeof(int) * 2 * size);
        for (int i = 0; i < 2 * size; i++) to[i] = rank * 100 + i;
        MPI_Alltoall(to, 2, MPI_INT, from, 2, MPI_INT, MPI_COMM_WORLD);
        if (from[2 * (size - 1)] != (size - 1) * 100 + 2 * rank) fail("alltoall", rank, it);

        MPI_Allgather(&mine, 1, MPI_INT, all, 1, MPI_INT, MPI_COMM_WORLD);
        if (all[0] != it) fail("allgather", rank, it);
        free(all);
        free(to);
        free(from);
    }
    MPI_Type_free(&triple);
    printf("OK %d\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
