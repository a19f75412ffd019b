/* Point-to-point traffic with known per-peer figures, for the stats layer's
 * e2e tests (tests/tests/stats.rs computes the same figures). Four ranks.
 *
 * Every phase exercises one way the layer must attribute a message:
 *  1. wildcard receives, with and without a status;
 *  2. nonblocking sends and receives (one wildcard) completed by Waitany
 *     with MPI_STATUS_IGNORE;
 *  3. persistent requests, Startall, completed by Waitall or a Testsome loop;
 *  4. a split communicator whose ranks differ from the world's, with a
 *     derived (vector) datatype, Recv with a status and Irecv + Wait without;
 *  5. matched probes: Mprobe + Mrecv, Improbe + Imrecv + Test loop;
 *  6. Sendrecv with a wildcard source and MPI_STATUS_IGNORE;
 *  7. collectives (Bcast, Allreduce, Gather, Ibarrier, Iallreduce; on
 *     MPI 4 libraries Alltoallv_c and a persistent Bcast_init);
 *  8. a receive cancelled before it matched.
 * Then every rank prints "READY <rank> <pid>" and waits for the go file
 * (argv[1]) before MPI_Finalize, so the daemon can read the live figures.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK(c)                                                         \
    do {                                                                 \
        if (!(c)) {                                                      \
            fprintf(stderr, "rank %d: check failed line %d: %s\n", rank, \
                    __LINE__, #c);                                       \
            MPI_Abort(MPI_COMM_WORLD, 2);                                \
        }                                                                \
    } while (0)

int main(int argc, char **argv) {
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 4) {
        fprintf(stderr, "needs 4 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    int buf[256];
    double dbuf[64];
    memset(buf, 0, sizeof buf);
    memset(dbuf, 0, sizeof dbuf);

    /* 1. Ranks 1..3 send 6 messages of 8*rank ints to rank 0. */
    if (rank == 0) {
        for (int i = 0; i < 18; i++) {
            MPI_Status st;
            if (i % 2) {
                MPI_Recv(buf, 256, MPI_INT, MPI_ANY_SOURCE, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else {
                MPI_Recv(buf, 256, MPI_INT, MPI_ANY_SOURCE, 1, MPI_COMM_WORLD, &st);
                int n;
                MPI_Get_count(&st, MPI_INT, &n);
                CHECK(n == 8 * st.MPI_SOURCE);
            }
        }
    } else {
        for (int i = 0; i < 6; i++)
            MPI_Send(buf, 8 * rank, MPI_INT, 0, 1, MPI_COMM_WORLD);
    }

    /* 2. Ring: 3 Isends of 10, 20, 30 doubles to the right, 3 Irecvs from
     * the left (the first a wildcard), completed by Waitany. */
    {
        int right = (rank + 1) % 4, left = (rank + 3) % 4;
        double in[3][30];
        MPI_Request r[6];
        for (int i = 0; i < 3; i++)
            MPI_Irecv(in[i], 30, MPI_DOUBLE, i == 0 ? MPI_ANY_SOURCE : left, 10 + i, MPI_COMM_WORLD, &r[i]);
        for (int i = 0; i < 3; i++)
            MPI_Isend(dbuf, 10 * (i + 1), MPI_DOUBLE, right, 10 + i, MPI_COMM_WORLD, &r[3 + i]);
        for (int done = 0; done < 6; done++) {
            int idx;
            MPI_Waitany(6, r, &idx, MPI_STATUS_IGNORE);
            CHECK(idx != MPI_UNDEFINED);
        }
    }

    /* 3. Persistent: 16 ints to and from rank^2, five rounds. */
    {
        int partner = rank ^ 2, out[16] = {0}, in[16];
        MPI_Request r[2];
        MPI_Recv_init(in, 16, MPI_INT, partner, 20, MPI_COMM_WORLD, &r[0]);
        MPI_Send_init(out, 16, MPI_INT, partner, 20, MPI_COMM_WORLD, &r[1]);
        for (int round = 0; round < 5; round++) {
            MPI_Startall(2, r);
            if (round % 2 == 0) {
                MPI_Waitall(2, r, MPI_STATUSES_IGNORE);
            } else {
                int done = 0;
                while (done < 2) {
                    int outcount, idx[2];
                    MPI_Testsome(2, r, &outcount, idx, MPI_STATUSES_IGNORE);
                    if (outcount != MPI_UNDEFINED)
                        done += outcount;
                }
            }
        }
        MPI_Request_free(&r[0]);
        MPI_Request_free(&r[1]);
    }

    /* 4. Split by parity, key -rank: sub-rank 0 is world 2 (or 3), sub-rank
     * 1 is world 0 (or 1). A vector type of 3 blocks of 2 ints (24 bytes). */
    {
        MPI_Comm sub;
        MPI_Comm_split(MPI_COMM_WORLD, rank % 2, -rank, &sub);
        int srank;
        MPI_Comm_rank(sub, &srank);
        CHECK(srank == (rank >= 2 ? 0 : 1));
        MPI_Datatype vec;
        MPI_Type_vector(3, 2, 4, MPI_INT, &vec);
        MPI_Type_commit(&vec);
        if (srank == 0) {
            MPI_Send(buf, 5, vec, 1, 30, sub);
            MPI_Request r;
            MPI_Irecv(buf, 5, vec, MPI_ANY_SOURCE, 31, sub, &r);
            MPI_Wait(&r, MPI_STATUS_IGNORE);
        } else {
            MPI_Status st;
            MPI_Recv(buf, 5, vec, MPI_ANY_SOURCE, 30, sub, &st);
            CHECK(st.MPI_SOURCE == 0);
            MPI_Request r;
            MPI_Isend(buf, 2, vec, 0, 31, sub, &r);
            MPI_Wait(&r, MPI_STATUS_IGNORE);
        }
        MPI_Type_free(&vec);
        MPI_Comm_free(&sub);
    }

    /* 5. Matched probes: 3 -> 1 (7 ints, Mprobe + Mrecv), 2 -> 1 (9 ints,
     * Improbe + Imrecv + Test). */
    if (rank == 3)
        MPI_Send(buf, 7, MPI_INT, 1, 77, MPI_COMM_WORLD);
    if (rank == 2)
        MPI_Send(buf, 9, MPI_INT, 1, 78, MPI_COMM_WORLD);
    if (rank == 1) {
        MPI_Message m;
        MPI_Mprobe(MPI_ANY_SOURCE, 77, MPI_COMM_WORLD, &m, MPI_STATUS_IGNORE);
        MPI_Mrecv(buf, 7, MPI_INT, &m, MPI_STATUS_IGNORE);
        int flag = 0;
        while (!flag)
            MPI_Improbe(MPI_ANY_SOURCE, 78, MPI_COMM_WORLD, &flag, &m, MPI_STATUS_IGNORE);
        MPI_Request r;
        MPI_Imrecv(buf, 9, MPI_INT, &m, &r);
        flag = 0;
        while (!flag)
            MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
    }

    /* 6. Sendrecv with rank^1: 3 ints each way, wildcard source. */
    {
        int out[3] = {1, 2, 3}, in[3];
        MPI_Sendrecv(out, 3, MPI_INT, rank ^ 1, 40, in, 3, MPI_INT, MPI_ANY_SOURCE, 40, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }

    /* 7. Collectives, blocking and nonblocking. */
    MPI_Bcast(buf, 10, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Allreduce(dbuf, dbuf + 4, 4, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Gather(buf, 2, MPI_INT, buf + 100, 2, MPI_INT, 1, MPI_COMM_WORLD);
    {
        MPI_Request r[2];
        MPI_Ibarrier(MPI_COMM_WORLD, &r[0]);
        MPI_Iallreduce(dbuf, dbuf + 8, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD, &r[1]);
        MPI_Waitall(2, r, MPI_STATUSES_IGNORE);
    }

#if MPI_VERSION >= 4
    /* 7b. Large-count forms (MPICH 4; Open MPI 4.1 is MPI 3.1): an
     * Alltoallv_c of one int per peer, with MPI_Count count arrays. */
    {
        MPI_Count counts[4] = {1, 1, 1, 1};
        MPI_Aint displs[4] = {0, 1, 2, 3};
        MPI_Alltoallv_c(buf, counts, displs, MPI_INT, buf + 50, counts, displs, MPI_INT,
                        MPI_COMM_WORLD);
    }
    /* 7c. A persistent collective (MPI 4): Bcast_init of 3 ints from world
     * rank 2, started twice. */
    {
        MPI_Request r;
        MPI_Bcast_init(buf, 3, MPI_INT, 2, MPI_COMM_WORLD, MPI_INFO_NULL, &r);
        for (int i = 0; i < 2; i++) {
            MPI_Start(&r);
            MPI_Wait(&r, MPI_STATUS_IGNORE);
        }
        MPI_Request_free(&r);
    }
#endif

    /* 8. A cancelled receive (never matched): counted as cancelled, not as
     * a message. */
    if (rank == 0) {
        MPI_Request r;
        MPI_Status st;
        int cancelled = 0;
        MPI_Irecv(buf, 1, MPI_INT, 1, 999, MPI_COMM_WORLD, &r);
        MPI_Cancel(&r);
        MPI_Wait(&r, &st);
        MPI_Test_cancelled(&st, &cancelled);
        CHECK(cancelled);
    }

    const char *go = argc > 1 ? argv[1] : NULL;
    printf("READY %d %d\n", rank, (int)getpid());
    fflush(stdout);
    while (go && access(go, F_OK) != 0)
        usleep(20000);
    MPI_Barrier(MPI_COMM_WORLD);
    printf("DONE %d\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
