/* One rank comes late to every collective of a kind: the wait states of
 * tests/tests/e2e/waits.rs.
 *
 * usage: late MODE ITERS DELAY_MS GOFILE
 * Every rank prints "READY <rank> <pid>", waits (without MPI calls, polling
 * every millisecond) until GOFILE exists, synchronises in one MPI_Barrier,
 * then runs ITERS rounds of MODE, checks every result it received, and
 * prints "OK <rank>" or exits non-zero:
 *   barrier  the last rank sleeps DELAY_MS before each MPI_Barrier;
 *   nxn      rank 2 (mod size) sleeps before each MPI_Allreduce;
 *   bcast    the root, rank 0, sleeps before each MPI_Bcast;
 *   reduce   the last rank sleeps before each MPI_Reduce to rank 0;
 *   sender   the last rank sleeps, then MPI_Sends to every other rank,
 *            which waits in MPI_Recv (a Late Sender for each);
 *   waitall  rank 0 posts an MPI_Irecv from every other rank and waits in
 *            MPI_Waitall; the last rank sleeps before its MPI_Send, the
 *            others send at once (a Late Sender: the latest, the last);
 *   receiver the last rank sleeps, then MPI_Recvs from every other rank in
 *            turn, 0 first; every other rank MPI_Ssends to it and waits
 *            until its receive is posted (a Late Receiver for each);
 *   issend   as receiver, but every other rank MPI_Issends and waits in
 *            MPI_Wait (a Late Receiver in the call that completes it);
 *   issendall as issend with two MPI_Issends each, tags 14 and 15,
 *            completed in one MPI_Waitall; the last rank receives every
 *            tag 14 message, then every tag 15 one (the Waitall waits for
 *            its latest receiver, its tag 15 receive).
 * Six more plant on communicators other than MPI_COMM_WORLD, made
 * before READY: HALF by MPI_Comm_split into even and odd world ranks (key
 * the world rank), D1 and D2 two MPI_Comm_dups of HALF in a row, DUP an
 * MPI_Comm_dup of MPI_COMM_WORLD:
 *   split    the last rank sleeps before each MPI_Barrier, on D1 in even
 *            rounds and D2 in odd ones: only the other ranks of its half
 *            wait;
 *   dup      rank 2 (mod size) sleeps before each MPI_Allreduce on DUP;
 *   idup     the same on IDUP, an MPI_Comm_idup of MPI_COMM_WORLD made
 *            after DUP (completed at once by MPI_Wait);
 *   cgroup   the odd ranks only: an MPI_Allreduce on G1 in even rounds
 *            and G2 in odd ones, two MPI_Comm_create_groups of the odd
 *            ranks' half over MPI_COMM_WORLD with tag 7, made before DUP
 *            by the odd ranks only (so DUP and IDUP are numbered alike on
 *            every rank only if they count nothing on the world); the
 *            last rank sleeps first: only the other odd ranks wait;
 *   subbcast each half broadcasts from its rank 1 (world rank 2 or 3)
 *            over HALF; the last rank, root of its half, sleeps first;
 *   subsender each half's rank 1 MPI_Sends to its rank 0 over HALF, which
 *            waits in MPI_Recv; the last rank sleeps first (a Late
 *            Sender for world rank 1).
 * And one with MPI 4's MPI_Isendrecv (MPICH; exits 2 on an MPI 3 library):
 *   isendrecv every rank MPI_Isendrecvs to its right neighbour and from
 *            its left one, then waits in MPI_Wait; the last rank sleeps
 *            first, so rank 0 waits for its message (a Late Sender).
 * Their times go to GOFILE.times.RANK as the others', the round's
 * communicator told by the rank's half.
 * Rounds make no other MPI call. Built with -DROTATE=N, N cycles of
 * barriers come before them, each rank late in turn (see there).
 *
 * The truth to hold the daemon's figures to: every rank writes, to
 * GOFILE.times.RANK, one line per call it makes after the go file
 * ("CALL ITER PEER ENTER LEAVE": the call's name, the round, the peer it
 * sends to or receives from, -1 if several, its enter and leave in
 * CLOCK_MONOTONIC ns, read around the call), so the test computes each
 * wait with Scalasca's formula from what really happened: on a loaded
 * machine the late rank sleeps longer than DELAY_MS, and the others wait
 * that long. The MPI_Irecvs are timed too: a Late Receiver's wait ends
 * when the receive is posted. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* One line of GOFILE.times.RANK; T0 is taken just before the call. */
static FILE *times;
static long long T0;
#define TIMED(call, it, peer, expr)                                                        \
    do {                                                                                   \
        T0 = now_ns();                                                                     \
        expr;                                                                              \
        fprintf(times, "%s %d %d %lld %lld\n", call, it, peer, T0, now_ns());              \
    } while (0)

static void fail(const char *what, int rank, int iter) {
    fprintf(stderr, "WRONG %s rank %d iter %d\n", what, rank, iter);
    MPI_Abort(MPI_COMM_WORLD, 3);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc < 5) {
        fprintf(stderr, "usage: late MODE ITERS DELAY_MS GOFILE\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const char *mode = argv[1];
    int iters = atoi(argv[2]);
    useconds_t delay = (useconds_t)atoi(argv[3]) * 1000;
    MPI_Comm half, d1, d2, dup, idup;
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
    MPI_Comm_dup(half, &d1);
    MPI_Comm_dup(half, &d2);
    MPI_Comm g1 = MPI_COMM_NULL, g2 = MPI_COMM_NULL;
    if (rank % 2) {
        MPI_Group odd;
        MPI_Comm_group(half, &odd);
        MPI_Comm_create_group(MPI_COMM_WORLD, odd, 7, &g1);
        MPI_Comm_create_group(MPI_COMM_WORLD, odd, 7, &g2);
        MPI_Group_free(&odd);
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    MPI_Request iq;
    MPI_Comm_idup(MPI_COMM_WORLD, &idup, &iq);
    MPI_Wait(&iq, MPI_STATUS_IGNORE);
    printf("READY %d %d\n", rank, (int)getpid());
    fflush(stdout);
    char path[4096];
    snprintf(path, sizeof path, "%s.times.%d", argv[4], rank);
    times = fopen(path, "w");
    if (!times) {
        fprintf(stderr, "late: cannot write %s\n", path);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    while (access(argv[4], F_OK) != 0) usleep(1000);
    /* An untimed call first: under `mpi-observer record` (the test records
     * the run), a thread's first event claims its ring, a millisecond or
     * more spent in the shim; here, not inside the timed Barrier, where the
     * ranks' clocks would count it as waiting and the daemon would not. */
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    TIMED("MPI_Barrier", -1, -1, MPI_Barrier(MPI_COMM_WORLD));
#ifdef ROTATE
    /* Built with -DROTATE=N (tests/tests/e2e/waits_nodes.rs): N cycles of
     * one MPI_Barrier per rank before the rounds, each rank in turn 10 ms
     * late to its own, so that every node is the last one somewhere and
     * the ranks' times bound the offsets between the nodes' clocks both
     * ways. Timed as rounds -2, -3, ... */
    for (int c = 0, n = 0; c < ROTATE; c++)
        for (int r = 0; r < size; r++, n++) {
            if (rank == r) usleep(10000);
            TIMED("MPI_Barrier", -2 - n, -1, MPI_Barrier(MPI_COMM_WORLD));
        }
#endif

    int last = size - 1;
    for (int it = 0; it < iters; it++) {
        if (!strcmp(mode, "barrier")) {
            if (rank == last) usleep(delay);
            TIMED("MPI_Barrier", it, -1, MPI_Barrier(MPI_COMM_WORLD));
        } else if (!strcmp(mode, "nxn")) {
            if (rank == 2 % size) usleep(delay);
            int v = rank + it, sum = 0;
            TIMED("MPI_Allreduce", it, -1,
                  MPI_Allreduce(&v, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
            if (sum != size * (size - 1) / 2 + size * it) fail("allreduce", rank, it);
        } else if (!strcmp(mode, "bcast")) {
            if (rank == 0) usleep(delay);
            int v = rank == 0 ? 1000 + it : -1;
            TIMED("MPI_Bcast", it, -1, MPI_Bcast(&v, 1, MPI_INT, 0, MPI_COMM_WORLD));
            if (v != 1000 + it) fail("bcast", rank, it);
        } else if (!strcmp(mode, "reduce")) {
            if (rank == last) usleep(delay);
            int v = rank + it, sum = -1;
            TIMED("MPI_Reduce", it, -1, MPI_Reduce(&v, &sum, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD));
            if (rank == 0 && sum != size * (size - 1) / 2 + size * it) fail("reduce", rank, it);
        } else if (!strcmp(mode, "sender")) {
            if (rank == last) {
                usleep(delay);
                for (int r = 0; r < last; r++) {
                    int v = 100 * it + r;
                    TIMED("MPI_Send", it, r, MPI_Send(&v, 1, MPI_INT, r, 7, MPI_COMM_WORLD));
                }
            } else {
                int v = -1;
                TIMED("MPI_Recv", it, last,
                      MPI_Recv(&v, 1, MPI_INT, last, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
                if (v != 100 * it + rank) fail("recv", rank, it);
            }
        } else if (!strcmp(mode, "waitall")) {
            if (rank == 0) {
                int v[64];
                MPI_Request q[64];
                int n = size - 1 < 64 ? size - 1 : 64;
                for (int r = 1; r <= n; r++)
                    TIMED("MPI_Irecv", it, r,
                          MPI_Irecv(&v[r - 1], 1, MPI_INT, r, 8, MPI_COMM_WORLD, &q[r - 1]));
                TIMED("MPI_Waitall", it, -1, MPI_Waitall(n, q, MPI_STATUSES_IGNORE));
                for (int r = 1; r <= n; r++)
                    if (v[r - 1] != 100 * it + r) fail("waitall", rank, it);
            } else if (rank <= 64) {
                if (rank == last) usleep(delay);
                int v = 100 * it + rank;
                TIMED("MPI_Send", it, 0, MPI_Send(&v, 1, MPI_INT, 0, 8, MPI_COMM_WORLD));
            }
        } else if (!strcmp(mode, "receiver")) {
            if (rank == last) {
                usleep(delay);
                for (int r = 0; r < last; r++) {
                    int v = -1;
                    TIMED("MPI_Recv", it, r,
                          MPI_Recv(&v, 1, MPI_INT, r, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
                    if (v != 100 * it + r) fail("receiver", rank, it);
                }
            } else {
                int v = 100 * it + rank;
                TIMED("MPI_Ssend", it, last, MPI_Ssend(&v, 1, MPI_INT, last, 9, MPI_COMM_WORLD));
            }
        } else if (!strcmp(mode, "issend") || !strcmp(mode, "issendall")) {
            int two = !strcmp(mode, "issendall");
            if (rank == last) {
                usleep(delay);
                for (int t = 0; t <= two; t++)
                    for (int r = 0; r < last; r++) {
                        int v = -1;
                        TIMED("MPI_Recv", it, r,
                              MPI_Recv(&v, 1, MPI_INT, r, 14 + t, MPI_COMM_WORLD,
                                       MPI_STATUS_IGNORE));
                        if (v != 100 * it + 10 * t + r) fail(mode, rank, it);
                    }
            } else {
                int v[2] = {100 * it + rank, 100 * it + 10 + rank};
                MPI_Request q[2];
                for (int t = 0; t <= two; t++)
                    TIMED("MPI_Issend", it, last,
                          MPI_Issend(&v[t], 1, MPI_INT, last, 14 + t, MPI_COMM_WORLD, &q[t]));
                if (two)
                    TIMED("MPI_Waitall", it, last, MPI_Waitall(2, q, MPI_STATUSES_IGNORE));
                else
                    TIMED("MPI_Wait", it, last, MPI_Wait(&q[0], MPI_STATUS_IGNORE));
            }
        } else if (!strcmp(mode, "split")) {
            if (rank == last) usleep(delay);
            TIMED("MPI_Barrier", it, -1, MPI_Barrier(it % 2 ? d2 : d1));
        } else if (!strcmp(mode, "dup") || !strcmp(mode, "idup")) {
            if (rank == 2 % size) usleep(delay);
            int v = rank + it, sum = 0;
            TIMED("MPI_Allreduce", it, -1,
                  MPI_Allreduce(&v, &sum, 1, MPI_INT, MPI_SUM, mode[0] == 'i' ? idup : dup));
            if (sum != size * (size - 1) / 2 + size * it) fail("allreduce on a dup", rank, it);
        } else if (!strcmp(mode, "cgroup")) {
            if (rank % 2) {
                if (rank == last) usleep(delay);
                int v = rank + it, sum = 0, want = 0;
                for (int r = 1; r < size; r += 2) want += r + it;
                TIMED("MPI_Allreduce", it, -1,
                      MPI_Allreduce(&v, &sum, 1, MPI_INT, MPI_SUM, it % 2 ? g2 : g1));
                if (sum != want) fail("allreduce on a create_group", rank, it);
            }
        } else if (!strcmp(mode, "subbcast")) {
            int hr, hs;
            MPI_Comm_rank(half, &hr);
            MPI_Comm_size(half, &hs);
            if (hs > 1) {
                if (rank == last && hr == 1) usleep(delay);
                int v = hr == 1 ? 1000 * rank + it : -1, root = rank % 2 + 2;
                TIMED("MPI_Bcast", it, -1, MPI_Bcast(&v, 1, MPI_INT, 1, half));
                if (v != 1000 * root + it) fail("bcast on half", rank, it);
            }
        } else if (!strcmp(mode, "subsender")) {
            int hr, hs;
            MPI_Comm_rank(half, &hr);
            MPI_Comm_size(half, &hs);
            /* Peers are timed as world ranks: the half's rank 0 is world
             * rank 0 or 1, its rank 1 world rank 2 or 3. */
            if (hs > 1 && hr == 1) {
                if (rank == last) usleep(delay);
                int v = 100 * it + rank;
                TIMED("MPI_Send", it, rank - 2, MPI_Send(&v, 1, MPI_INT, 0, 11, half));
            } else if (hs > 1 && hr == 0) {
                int v = -1;
                TIMED("MPI_Recv", it, rank + 2,
                      MPI_Recv(&v, 1, MPI_INT, 1, 11, half, MPI_STATUS_IGNORE));
                if (v != 100 * it + rank + 2) fail("recv on half", rank, it);
            }
        } else if (!strcmp(mode, "isendrecv")) {
#if MPI_VERSION >= 4
            int right = (rank + 1) % size, left = (rank + size - 1) % size;
            int out = 100 * it + rank, in = -1;
            MPI_Request q;
            if (rank == last) usleep(delay);
            TIMED("MPI_Isendrecv", it, right,
                  MPI_Isendrecv(&out, 1, MPI_INT, right, 12, &in, 1, MPI_INT, left, 12,
                                MPI_COMM_WORLD, &q));
            TIMED("MPI_Wait", it, left, MPI_Wait(&q, MPI_STATUS_IGNORE));
            if (in != 100 * it + left) fail("isendrecv", rank, it);
#else
            fprintf(stderr, "late: isendrecv needs MPI 4\n");
            MPI_Abort(MPI_COMM_WORLD, 2);
#endif
        } else {
            fprintf(stderr, "late: unknown mode %s\n", mode);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    fclose(times);
    if (g1 != MPI_COMM_NULL) MPI_Comm_free(&g1);
    if (g2 != MPI_COMM_NULL) MPI_Comm_free(&g2);
    MPI_Comm_free(&idup);
    MPI_Comm_free(&dup);
    MPI_Comm_free(&d2);
    MPI_Comm_free(&d1);
    MPI_Comm_free(&half);
    printf("OK %d\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
