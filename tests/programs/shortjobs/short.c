/* A short job with known calls, for tests/tests/e2e/shortjobs.rs.
 *
 * usage: short MS [GOFILE]
 * Every rank waits MS milliseconds after MPI_Init (no MPI call), then makes
 * 7 MPI_Barrier and 11 MPI_Allreduce calls, checks every sum, prints
 * "OK <rank>" and finalizes: the counted calls come last, just before
 * MPI_Finalize, where a daemon that has not read the rank by then loses
 * them. With GOFILE, each rank first prints "READY <rank> <pid>" and waits
 * (polling every millisecond, no MPI call) until GOFILE exists. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int size;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int ms = argc > 1 ? atoi(argv[1]) : 0;
    if (argc > 2) {
        printf("READY %d %d\n", rank, (int)getpid());
        fflush(stdout);
        while (access(argv[2], F_OK) != 0) usleep(1000);
    }
    usleep((useconds_t)ms * 1000);
    for (int i = 0; i < 7; i++) MPI_Barrier(MPI_COMM_WORLD);
    for (int i = 0; i < 11; i++) {
        int one = 1, total = 0;
        MPI_Allreduce(&one, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        if (total != size) {
            fprintf(stderr, "WRONG allreduce %d\n", i);
            MPI_Abort(MPI_COMM_WORLD, 3);
        }
    }
    printf("OK %d\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
