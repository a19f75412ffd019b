/* Instructions per MPI call, counted by callgrind for `cargo xtask bench
 * insns`: argv[1] names the call (`rank`: MPI_Comm_rank, the cheapest, so
 * the layering's cost is not hidden; `sendrecv`: an 8-byte MPI_Sendrecv to
 * itself on MPI_COMM_WORLD, which `stats` times, sizes, counts per peer
 * and numbers for the wait states), argv[2] how many. Only timed_loop is
 * counted (`--toggle-collect=timed_loop`); as many calls before it warm up
 * the stack (its first call builds it) and the caches. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int sendrecv;
static int me;
static double out = 1, in;

__attribute__((noinline)) static int calls_loop(int calls) {
    int sink = 0, r = 0;
    for (int i = 0; i < calls; i++) {
        if (sendrecv)
            MPI_Sendrecv(&out, 1, MPI_DOUBLE, me, 0, &in, 1, MPI_DOUBLE, me, 0, MPI_COMM_WORLD,
                         MPI_STATUS_IGNORE);
        else
            MPI_Comm_rank(MPI_COMM_WORLD, &r);
        sink += r;
    }
    return sink;
}

/* The counted part: callgrind collects from its entry to its return. */
__attribute__((noinline)) int timed_loop(int calls) { return calls_loop(calls); }

int main(int argc, char **argv) {
    if (argc < 3 || (strcmp(argv[1], "rank") && strcmp(argv[1], "sendrecv"))) {
        fprintf(stderr, "usage: insns rank|sendrecv CALLS\n");
        return 2;
    }
    sendrecv = !strcmp(argv[1], "sendrecv");
    int calls = atoi(argv[2]);
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    int sink = calls_loop(calls); /* the warm-up: not counted */
    sink += timed_loop(calls);
    printf("insns calls=%d sink=%d\n", calls, sink);
    MPI_Finalize();
    return 0;
}
