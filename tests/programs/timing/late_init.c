/*
 * Prints "READY <rank> <pid>" BEFORE MPI_Init (the rank from the launcher's
 * environment), waits for the go file given as argv[2] without MPI calls,
 * then runs argv[1] rounds of MPI_Allreduce and MPI_Barrier, sleeping 20 ms
 * per round so that the daemon meets the new segment mid-run, and
 * finalizes. Used by tests/tests/shim_timing.rs for the handover from the
 * probes to the shim's timing.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int env_rank(void) {
    const char *names[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"};
    for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *v = getenv(names[i]);
        if (v)
            return atoi(v);
    }
    return -1;
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 10;
    const char *go = argc > 2 ? argv[2] : NULL;
    printf("READY %d %d\n", env_rank(), (int)getpid());
    fflush(stdout);
    while (go && access(go, F_OK) != 0)
        usleep(10000);
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    struct timespec pause = {0, 20 * 1000 * 1000};
    for (int i = 0; i < iters; i++) {
        double one = 1.0, sum = 0.0;
        MPI_Allreduce(&one, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        nanosleep(&pause, NULL);
    }
    MPI_Finalize();
    printf("OK %d\n", rank);
    fflush(stdout);
    return 0;
}
