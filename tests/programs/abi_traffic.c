/* A known mix of calls for the MPI-5 standard ABI (built with mpicc_abi,
 * linked to libmpi_abi.so): predefined datatypes whose size the handle
 * encodes (MPI_INT32_T, MPI_BYTE, MPI_UINT64_T), ones the platform fixes
 * (MPI_INT, MPI_DOUBLE, MPI_DOUBLE_INT), MPI_IN_PLACE, and some whose size
 * the probe cannot know (a derived type; MPI_INTEGER, which depends on the
 * Fortran compiler's flags).
 *
 * usage: abi_traffic ITER GOFILE   (exactly 3 ranks)
 * Every rank prints "READY <rank> <pid>", waits (without MPI calls) until
 * GOFILE exists, runs ITER iterations of the counted phase, checks every
 * result it received, and prints "OK <rank>" or exits non-zero. The expected
 * per-rank counts and bytes are in tests/tests/observer_abi.rs. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void fail(const char *what, int rank, int iter) {
    fprintf(stderr, "WRONG %s rank %d iter %d\n", what, rank, iter);
    MPI_Abort(MPI_COMM_WORLD, 3);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 3) {
        fprintf(stderr, "abi_traffic needs exactly 3 ranks, not %d\n", size);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int iters = argc > 1 ? atoi(argv[1]) : 10;
    const char *go = argc > 2 ? argv[2] : NULL;
    /* Created before the counted phase (and not probed by default anyway). */
    MPI_Datatype triple;
    MPI_Type_contiguous(3, MPI_INT, &triple);
    MPI_Type_commit(&triple);
    printf("READY %d %d\n", rank, (int)getpid());
    fflush(stdout);
    while (go && access(go, F_OK) != 0)
        usleep(20000);

    for (int it = 0; it < iters; it++) {
        /* Point to point, a chain 0 -> 1 -> 2 -> 0 that cannot deadlock. */
        int32_t a[25];    /* 100 bytes, size from the handle */
        int t[6];         /* 2 triples: derived, unknown */
        double d[8];      /* 64 bytes, size from the platform */
        int x[4];         /* MPI_INTEGER: unknown */
        int c[10];        /* 40 bytes */
        if (rank == 0) {
            for (int i = 0; i < 25; i++) a[i] = it + i;
            for (int i = 0; i < 6; i++) t[i] = it * 2 + i;
            MPI_Send(a, 25, MPI_INT32_T, 1, 1, MPI_COMM_WORLD);
            MPI_Send(t, 2, triple, 1, 2, MPI_COMM_WORLD);
            MPI_Recv(c, 10, MPI_INT, 2, 5, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            if (c[9] != it * 3 + 9) fail("recv int", rank, it);
        } else if (rank == 1) {
            MPI_Recv(a, 25, MPI_INT32_T, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            if (a[24] != it + 24) fail("recv int32", rank, it);
            MPI_Recv(t, 2, triple, 0, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            if (t[5] != it * 2 + 5) fail("recv derived", rank, it);
            for (int i = 0; i < 8; i++) d[i] = it + i * 0.5;
            for (int i = 0; i < 4; i++) x[i] = it - i;
            MPI_Send(d, 8, MPI_DOUBLE, 2, 3, MPI_COMM_WORLD);
            MPI_Send(x, 4, MPI_INTEGER, 2, 4, MPI_COMM_WORLD);
        } else {
            MPI_Recv(d, 8, MPI_DOUBLE, 1, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            if (d[7] != it + 3.5) fail("recv double", rank, it);
            MPI_Recv(x, 4, MPI_INTEGER, 1, 4, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            if (x[3] != it - 3) fail("recv integer", rank, it);
            for (int i = 0; i < 10; i++) c[i] = it * 3 + i;
            MPI_Send(c, 10, MPI_INT, 0, 5, MPI_COMM_WORLD);
        }

        /* Broadcasts: 64 + 32 bytes, counted as recv on every rank. */
        unsigned char b[64];
        uint64_t u[4];
        if (rank == 0) {
            memset(b, it & 0xff, sizeof b);
            for (int i = 0; i < 4; i++) u[i] = (uint64_t)it << 40 | (uint64_t)i;
        }
        MPI_Bcast(b, 64, MPI_BYTE, 0, MPI_COMM_WORLD);
        MPI_Bcast(u, 4, MPI_UINT64_T, 0, MPI_COMM_WORLD);
        if (b[63] != (unsigned char)(it & 0xff) || u[3] != ((uint64_t)it << 40 | 3))
            fail("bcast", rank, it);

        /* Reductions: 32 + 32, in place (0 sent) + 12, 24 + 24 bytes. */
        double s[4], r[4];
        for (int i = 0; i < 4; i++) s[i] = rank + i;
        MPI_Allreduce(s, r, 4, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        if (r[1] != 6.0) fail("allreduce sum", rank, it); /* (0+1)+(1+1)+(2+1) */
        int m[3] = {rank, rank * 2, it};
        MPI_Allreduce(MPI_IN_PLACE, m, 3, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (m[0] != 2 || m[1] != 4 || m[2] != it) fail("allreduce in place", rank, it);
        struct { double v; int i; } in[2], out[2];
        for (int i = 0; i < 2; i++) { in[i].v = (rank + i) % 3; in[i].i = rank; }
        MPI_Allreduce(in, out, 2, MPI_DOUBLE_INT, MPI_MAXLOC, MPI_COMM_WORLD);
        if (out[0].v != 2 || out[0].i != 2 || out[1].v != 2 || out[1].i != 1)
            fail("allreduce maxloc", rank, it);
    }
    MPI_Type_free(&triple);
    printf("OK %d\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
