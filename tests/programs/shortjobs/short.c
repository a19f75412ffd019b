/* A short job with known calls, for tests/tests/e2e/shortjobs.rs.
 *
 * usage: short MS
 * Every rank waits MS milliseconds after MPI_Init (no MPI call), then makes
 * 7 MPI_Barrier and 11 MPI_Allreduce calls, checks every sum, and
 * finalizes: the counted calls come last, just before MPI_Finalize, where a
 * daemon that has not read the rank by then loses them. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int size;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int ms = argc > 1 ? atoi(argv[1]) : 0;
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
    MPI_Finalize();
    return 0;
}
