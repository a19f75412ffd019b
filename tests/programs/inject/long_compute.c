/* long_compute: a rank in a long compute phase when the daemon comes.
 *
 * usage: long_compute SECS CALLS GOFILE
 * Every rank prints "READY <rank> <pid>", waits for GOFILE without any MPI
 * call, then computes for SECS seconds (a sleep: no MPI call, no signal),
 * then makes CALLS MPI_Barrier calls 5 ms apart, prints "OK <rank>" and
 * finalises. A daemon with --inject and an --inject-timeout shorter than
 * SECS lets the rank go untraced and injects it at its calls after the
 * compute phase; probes before the handover plus the shim after it must
 * count exactly CALLS barriers. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int secs = argc > 1 ? atoi(argv[1]) : 60;
    int calls = argc > 2 ? atoi(argv[2]) : 100;
    const char *go = argc > 3 ? argv[3] : NULL;
    printf("READY %d %d\n", rank, (int)getpid());
    fflush(stdout);
    while (go && access(go, F_OK) != 0)
        usleep(20000);
    /* sleep() may return early on a signal: sleep until the time is up. */
    unsigned left = (unsigned)secs;
    while (left > 0)
        left = sleep(left);
    for (int i = 0; i < calls; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        usleep(5000);
    }
    printf("OK %d\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
