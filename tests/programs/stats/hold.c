/* Live request health: rank 0 posts 5 receives from rank 1 and holds them
 * outstanding until the go file (argv[1]) exists; rank 1 then sends them.
 * Every rank prints "READY <rank> <pid>" once its requests are posted. */
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int rank, in[5], out[5] = {1, 2, 3, 4, 5};
    MPI_Request r[5];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0)
        for (int i = 0; i < 5; i++)
            MPI_Irecv(&in[i], 1, MPI_INT, 1, 99, MPI_COMM_WORLD, &r[i]);
    const char *go = argc > 1 ? argv[1] : NULL;
    printf("READY %d %d\n", rank, (int)getpid());
    fflush(stdout);
    while (go && access(go, F_OK) != 0)
        usleep(20000);
    if (rank == 1)
        for (int i = 0; i < 5; i++)
            MPI_Send(&out[i], 1, MPI_INT, 0, 99, MPI_COMM_WORLD);
    if (rank == 0) {
        MPI_Waitall(5, r, MPI_STATUSES_IGNORE);
        for (int i = 0; i < 5; i++)
            if (in[i] != i + 1)
                MPI_Abort(MPI_COMM_WORLD, 2);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    printf("DONE %d\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
