/* One MPI function called from two call sites with known counts, and
 * point-to-point traffic of known sizes, for tests/tests/callsites.rs.
 *
 * usage: two_sites A B M GOFILE   (2 ranks)
 * Every rank prints "READY <rank> <pid>" and waits (without MPI calls) for
 * GOFILE. Then it calls MPI_Allreduce A times from step_a and B times from
 * step_b (a sum and a maximum), and exchanges M messages each way with MPI_Send/MPI_Recv: rank 0
 * sends 100 ints (400 B) to rank 1, rank 1 sends 1000 ints (4000 B) to
 * rank 0. Every result is checked; it prints "OK <rank>" or exits non-zero.
 * The tests find the two call lines by the marks in their comments. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void fail(const char *what, int rank, int i) {
    fprintf(stderr, "WRONG %s rank %d at %d\n", what, rank, i);
    MPI_Abort(MPI_COMM_WORLD, 3);
}

/* noipa: each keeps its own name and code (no step_a.constprop.0, and no
 * identical-code folding of the two into one). */
__attribute__((noipa)) static long step_a(long v) {
    long sum = 0;
    MPI_Allreduce(&v, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD); /* SITE_A */
    return sum;
}

__attribute__((noipa)) static long step_b(long v) {
    long sum = 0;
    MPI_Allreduce(&v, &sum, 1, MPI_LONG, MPI_MAX, MPI_COMM_WORLD); /* SITE_B */
    return sum;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc < 5 || size != 2) {
        if (rank == 0) fprintf(stderr, "usage: two_sites A B M GOFILE, on 2 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    long a = atol(argv[1]), b = atol(argv[2]), m = atol(argv[3]);
    printf("READY %d %d\n", rank, (int)getpid());
    fflush(stdout);
    while (access(argv[4], F_OK) != 0) usleep(20000);

    for (long i = 0; i < a; i++)
        if (step_a(i + rank) != 2 * i + 1) fail("step_a", rank, (int)i);
    for (long i = 0; i < b; i++)
        if (step_b(i * rank) != i) fail("step_b", rank, (int)i);

    static int small[100], large[1000];
    for (long i = 0; i < m; i++) {
        if (rank == 0) {
            for (int k = 0; k < 100; k++) small[k] = (int)i + k;
            MPI_Send(small, 100, MPI_INT, 1, 7, MPI_COMM_WORLD);
            MPI_Recv(large, 1000, MPI_INT, 1, 8, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            if (large[999] != (int)i * 2 + 999) fail("recv large", rank, (int)i);
        } else {
            MPI_Recv(small, 100, MPI_INT, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            if (small[99] != (int)i + 99) fail("recv small", rank, (int)i);
            for (int k = 0; k < 1000; k++) large[k] = (int)i * 2 + k;
            MPI_Send(large, 1000, MPI_INT, 0, 8, MPI_COMM_WORLD);
        }
    }
    printf("OK %d\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
