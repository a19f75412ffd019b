/* Three phases of CALLS (argv[1]) MPI_Allreduce calls each, across which a
 * test restarts the daemon. Every rank prints "READY <rank> <pid>", then
 * waits for the go file (argv[2]) before phase 1 and for GO.2 and GO.3
 * before phases 2 and 3; after each phase it prints "PHASE <p> <rank>".
 * Then it waits for GO.4 (so its last line never races the test's reading
 * of the PHASE lines), checks the sums and prints "OK <rank>". */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void wait_file(const char *go, int phase) {
    char path[4096];
    if (phase == 1)
        snprintf(path, sizeof path, "%s", go);
    else
        snprintf(path, sizeof path, "%s.%d", go, phase);
    while (access(path, F_OK) != 0)
        usleep(20000);
}

int main(int argc, char **argv) {
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc < 3)
        MPI_Abort(MPI_COMM_WORLD, 1);
    int calls = atoi(argv[1]);
    const char *go = argv[2];
    printf("READY %d %d\n", rank, (int)getpid());
    fflush(stdout);
    int bad = 0;
    for (int phase = 1; phase <= 3; phase++) {
        wait_file(go, phase);
        for (int i = 0; i < calls; i++) {
            int in = rank + i, out = 0;
            MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
            bad |= out != size * i + size * (size - 1) / 2;
        }
        printf("PHASE %d %d\n", phase, rank);
        fflush(stdout);
    }
    wait_file(go, 4);
    if (!bad)
        printf("OK %d\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
