/* A short job with known calls, for tests/tests/e2e/handover.rs and the
 * exit handover's attack test in tests/tests/e2e/security.rs.
 *
 * usage: allreduce [AFTER_MS]
 * Every rank makes 25 MPI_Allreduce calls right after MPI_Init, checks
 * every sum and finalizes; then, outside MPI, waits AFTER_MS milliseconds
 * (default 0) before it exits, saying "finalized" first: a rank that a
 * daemon started then finds only after its segment is gone. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int size;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int i = 0; i < 25; i++) {
        int one = 1, total = 0;
        MPI_Allreduce(&one, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        if (total != size) {
            fprintf(stderr, "WRONG allreduce %d\n", i);
            MPI_Abort(MPI_COMM_WORLD, 3);
        }
    }
    MPI_Finalize();
    int after = argc > 1 ? atoi(argv[1]) : 0;
    if (after > 0) {
        /* Said once its segment is unlinked: the test starts a daemon. */
        printf("finalized\n");
        fflush(stdout);
    }
    usleep((useconds_t)after * 1000);
    return 0;
}
