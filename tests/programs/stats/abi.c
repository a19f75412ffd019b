/* Point-to-point traffic with known per-peer figures for the stats layer on
 * the MPI-5 standard ABI (built with MPICH 5's mpicc_abi, linked against
 * libmpi_abi.so); tests/tests/stats_abi.rs computes the same figures.
 * Three ranks; `right` is rank + 1, `left` rank - 1 (mod 3).
 *
 * Every phase exercises one part of the standard ABI the layer must read:
 *  1. wildcard receives, with a status (8 ints: MPI_SOURCE at 0) and with
 *     MPI_STATUS_IGNORE (0); MPI_INT32_T, whose size is in its handle;
 *  2. a nonblocking ring completed by Waitall with a status array (a
 *     stride of 32 bytes); MPI_DOUBLE, sized by the library. MPICH returns
 *     one shared, already complete request for every eager send, so the
 *     three Isends' handles are equal: each must complete its own entry;
 *  3. nonblocking wildcard receives completed by Waitany with
 *     MPI_STATUS_IGNORE; MPI_BYTE;
 *  4. derived datatypes (MPI_Type_vector): a receive whose type is freed
 *     before it completes, and Sendrecv with a wildcard and a status;
 *  5. a split communicator whose ranks are the world's reversed (a user
 *     handle, a pointer): the layer translates its ranks;
 *  6. matched probes (Mprobe + Mrecv, Improbe + Imrecv + Test) and
 *     MPI_MESSAGE_NO_PROC (0x129);
 *  7. MPI_PROC_NULL (-3), blocking and nonblocking: nothing is counted;
 *  8. persistent requests, Startall, Waitall with MPI_STATUSES_IGNORE;
 *  9. a receive cancelled before it matched;
 * 10. collectives: Bcast, Allreduce, Gather with MPI_IN_PLACE (1) at the
 *     root, Iallreduce.
 * Then every rank prints "READY <rank> <pid>" and waits for the go file
 * (argv[1]) before MPI_Finalize, so the daemon can read the live figures.
 */
#include <mpi.h>
#include <stdint.h>
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
    if (size != 3) {
        fprintf(stderr, "needs 3 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    {
        int major = 0, minor = 0;
        MPI_Abi_get_version(&major, &minor);
        CHECK(major == 1);
    }
    const int right = (rank + 1) % 3, left = (rank + 2) % 3;
    static int32_t ibuf[1024];
    static double dbuf[256];
    static char cbuf[1024];
    static int64_t lbuf[256];

    /* 1. Ranks 1 and 2 send 4 messages of 5*rank int32_t to rank 0. */
    if (rank == 0) {
        for (int i = 0; i < 8; i++) {
            MPI_Status st;
            if (i % 2) {
                MPI_Recv(ibuf, 64, MPI_INT32_T, MPI_ANY_SOURCE, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else {
                MPI_Recv(ibuf, 64, MPI_INT32_T, MPI_ANY_SOURCE, 1, MPI_COMM_WORLD, &st);
                int n;
                MPI_Get_count(&st, MPI_INT32_T, &n);
                CHECK(st.MPI_SOURCE == 1 || st.MPI_SOURCE == 2);
                CHECK(st.MPI_TAG == 1);
                CHECK(n == 5 * st.MPI_SOURCE);
            }
        }
    } else {
        for (int i = 0; i < 4; i++)
            MPI_Send(ibuf, 5 * rank, MPI_INT32_T, 0, 1, MPI_COMM_WORLD);
    }

    /* 2. Ring: 3 Isends of 7, 14, 21 doubles to the right, 3 Irecvs from
     * the left (the first a wildcard), one Waitall with statuses. */
    {
        static double in[3][21];
        MPI_Request r[6];
        MPI_Status st[6];
        for (int i = 0; i < 3; i++)
            MPI_Irecv(in[i], 21, MPI_DOUBLE, i == 0 ? MPI_ANY_SOURCE : left, 10 + i, MPI_COMM_WORLD, &r[i]);
        for (int i = 0; i < 3; i++)
            MPI_Isend(dbuf, 7 * (i + 1), MPI_DOUBLE, right, 10 + i, MPI_COMM_WORLD, &r[3 + i]);
        MPI_Waitall(6, r, st);
        for (int i = 0; i < 3; i++) {
            int n;
            MPI_Get_count(&st[i], MPI_DOUBLE, &n);
            CHECK(st[i].MPI_SOURCE == left);
            CHECK(n == 7 * (i + 1));
            CHECK(r[i] == MPI_REQUEST_NULL);
        }
    }

    /* 3. 100 and 200 bytes to the right, two wildcard Irecvs, Waitany with
     * MPI_STATUS_IGNORE. */
    {
        MPI_Request r[4];
        for (int i = 0; i < 2; i++)
            MPI_Irecv(cbuf + 300 * i, 300, MPI_BYTE, MPI_ANY_SOURCE, 20, MPI_COMM_WORLD, &r[i]);
        MPI_Isend(cbuf + 600, 100, MPI_BYTE, right, 20, MPI_COMM_WORLD, &r[2]);
        MPI_Isend(cbuf + 700, 200, MPI_BYTE, right, 20, MPI_COMM_WORLD, &r[3]);
        for (int done = 0; done < 4; done++) {
            int idx;
            MPI_Waitany(4, r, &idx, MPI_STATUS_IGNORE);
            CHECK(idx != MPI_UNDEFINED);
        }
    }

    /* 4. Derived datatypes. A vector of 4 blocks of 3 ints (48 bytes): 2 to
     * the right, received into a wildcard Irecv whose type is freed before
     * the Wait. A vector of 2 blocks of 2 int64_t (32 bytes): 3 to the
     * left by Sendrecv, from a wildcard, with a status. */
    {
        MPI_Datatype vec;
        MPI_Type_vector(4, 3, 5, MPI_INT, &vec);
        MPI_Type_commit(&vec);
        MPI_Request r;
        MPI_Irecv(ibuf, 2, vec, MPI_ANY_SOURCE, 30, MPI_COMM_WORLD, &r);
        MPI_Send(ibuf + 512, 2, vec, right, 30, MPI_COMM_WORLD);
        MPI_Type_free(&vec);
        MPI_Wait(&r, MPI_STATUS_IGNORE);

        MPI_Datatype vec2;
        MPI_Type_vector(2, 2, 3, MPI_INT64_T, &vec2);
        MPI_Type_commit(&vec2);
        MPI_Status st;
        MPI_Sendrecv(lbuf, 3, vec2, left, 31, lbuf + 128, 3, vec2, MPI_ANY_SOURCE, 31, MPI_COMM_WORLD, &st);
        int n;
        MPI_Get_count(&st, vec2, &n);
        CHECK(st.MPI_SOURCE == right);
        CHECK(n == 3);
        MPI_Type_free(&vec2);
    }

    /* 5. Reversed ranks (rev rank 2 - rank): 5 uint16_t to rev rank + 1,
     * which is world left; a wildcard Recv with a status names rev ranks. */
    {
        MPI_Comm rev;
        MPI_Comm_split(MPI_COMM_WORLD, 0, -rank, &rev);
        int rrank;
        MPI_Comm_rank(rev, &rrank);
        CHECK(rrank == 2 - rank);
        MPI_Request r;
        MPI_Status st;
        MPI_Isend(cbuf, 5, MPI_UINT16_T, (rrank + 1) % 3, 40, rev, &r);
        MPI_Recv(cbuf + 100, 5, MPI_UINT16_T, MPI_ANY_SOURCE, 40, rev, &st);
        CHECK(st.MPI_SOURCE == (rrank + 2) % 3);
        MPI_Wait(&r, MPI_STATUS_IGNORE);
        MPI_Comm_free(&rev);
    }

    /* 6. Matched probes at rank 0: 6 chars from rank 1 (Mprobe + Mrecv), 9
     * bytes from rank 2 (Improbe + Imrecv + Test); a probe of
     * MPI_PROC_NULL gives MPI_MESSAGE_NO_PROC, whose Mrecv moves nothing. */
    if (rank == 1)
        MPI_Send(cbuf, 6, MPI_CHAR, 0, 50, MPI_COMM_WORLD);
    if (rank == 2)
        MPI_Send(cbuf, 9, MPI_BYTE, 0, 51, MPI_COMM_WORLD);
    if (rank == 0) {
        MPI_Message m;
        MPI_Status st;
        MPI_Mprobe(MPI_ANY_SOURCE, 50, MPI_COMM_WORLD, &m, &st);
        CHECK(st.MPI_SOURCE == 1);
        MPI_Mrecv(cbuf, 6, MPI_CHAR, &m, MPI_STATUS_IGNORE);
        CHECK(m == MPI_MESSAGE_NULL);
        int flag = 0;
        while (!flag)
            MPI_Improbe(MPI_ANY_SOURCE, 51, MPI_COMM_WORLD, &flag, &m, MPI_STATUS_IGNORE);
        MPI_Request r;
        MPI_Imrecv(cbuf, 9, MPI_BYTE, &m, &r);
        flag = 0;
        while (!flag)
            MPI_Test(&r, &flag, &st);
        int n;
        MPI_Get_count(&st, MPI_BYTE, &n);
        CHECK(st.MPI_SOURCE == 2 && n == 9);
        MPI_Mprobe(MPI_PROC_NULL, 52, MPI_COMM_WORLD, &m, MPI_STATUS_IGNORE);
        CHECK(m == MPI_MESSAGE_NO_PROC);
        MPI_Mrecv(cbuf, 4, MPI_BYTE, &m, &st);
        CHECK(st.MPI_SOURCE == MPI_PROC_NULL);
    }

    /* 7. MPI_PROC_NULL: no message, no byte, nothing unattributed. */
    {
        MPI_Status st;
        MPI_Request r[2];
        MPI_Send(ibuf, 4, MPI_INT, MPI_PROC_NULL, 60, MPI_COMM_WORLD);
        MPI_Recv(ibuf, 4, MPI_INT, MPI_PROC_NULL, 60, MPI_COMM_WORLD, &st);
        CHECK(st.MPI_SOURCE == MPI_PROC_NULL);
        MPI_Isend(ibuf, 4, MPI_INT, MPI_PROC_NULL, 61, MPI_COMM_WORLD, &r[0]);
        MPI_Irecv(ibuf, 4, MPI_INT, MPI_PROC_NULL, 61, MPI_COMM_WORLD, &r[1]);
        MPI_Waitall(2, r, MPI_STATUSES_IGNORE);
    }

    /* 8. Persistent: 16 ints to the right, from the left, 3 rounds. */
    {
        MPI_Request r[2];
        MPI_Recv_init(ibuf, 16, MPI_INT, left, 70, MPI_COMM_WORLD, &r[0]);
        MPI_Send_init(ibuf + 64, 16, MPI_INT, right, 70, MPI_COMM_WORLD, &r[1]);
        for (int round = 0; round < 3; round++) {
            MPI_Startall(2, r);
            MPI_Waitall(2, r, MPI_STATUSES_IGNORE);
        }
        MPI_Request_free(&r[0]);
        MPI_Request_free(&r[1]);
    }

    /* 9. A receive cancelled before it matched. */
    if (rank == 0) {
        MPI_Request r;
        MPI_Status st;
        int cancelled = 0;
        MPI_Irecv(ibuf, 1, MPI_INT, 1, 999, MPI_COMM_WORLD, &r);
        MPI_Cancel(&r);
        MPI_Wait(&r, &st);
        MPI_Test_cancelled(&st, &cancelled);
        CHECK(cancelled);
    }

    /* 10. Collectives: Bcast of 10 int32_t from rank 1, Allreduce of 3
     * doubles, Gather of 2 ints to rank 0 with MPI_IN_PLACE at the root,
     * Iallreduce of 2 int64_t. */
    MPI_Bcast(ibuf, 10, MPI_INT32_T, 1, MPI_COMM_WORLD);
    MPI_Allreduce(dbuf, dbuf + 8, 3, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        MPI_Gather(MPI_IN_PLACE, 2, MPI_INT, ibuf + 100, 2, MPI_INT, 0, MPI_COMM_WORLD);
    else
        MPI_Gather(ibuf, 2, MPI_INT, NULL, 0, MPI_INT, 0, MPI_COMM_WORLD);
    {
        MPI_Request r;
        MPI_Iallreduce(lbuf, lbuf + 8, 2, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD, &r);
        MPI_Wait(&r, MPI_STATUS_IGNORE);
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
