/* The program for the exact-count tests, on 2 ranks: it prints
 * "READY <rank> <pid>", waits for its go file (argv[1]), then makes a known
 * number of calls (the test's expected counts mirror them), checks every
 * answer, and prints "DONE <rank>". Per rank: 3 MPI_Comm_rank, 2
 * MPI_Comm_size, 1 MPI_Type_size, 1 MPI_Barrier; rank 0 makes SENDS
 * MPI_Send and rank 1 as many MPI_Recv. */
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>

#define SENDS 5

static void check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "callers counts: %s\n", what);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
}

int main(int argc, char **argv) {
    int rank, again, size, bytes, v;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    check(size == 2, "run on 2 ranks");
    printf("READY %d %d\n", rank, (int)getpid());
    fflush(stdout);
    const char *go = argc > 1 ? argv[1] : NULL;
    while (go && access(go, F_OK) != 0)
        usleep(20000);

    for (int i = 0; i < SENDS; i++) {
        if (rank == 0) {
            MPI_Send(&i, 1, MPI_INT, 1, i, MPI_COMM_WORLD);
        } else {
            MPI_Recv(&v, 1, MPI_INT, 0, i, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            check(v == i, "Recv payload");
        }
    }
    for (int i = 0; i < 2; i++) {
        MPI_Comm_rank(MPI_COMM_WORLD, &again);
        check(again == rank, "MPI_Comm_rank");
    }
    MPI_Type_size(MPI_DOUBLE, &bytes);
    check(bytes == 8, "MPI_Type_size");
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    check(size == 2, "MPI_Comm_size");
    MPI_Barrier(MPI_COMM_WORLD);

    printf("DONE %d\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
