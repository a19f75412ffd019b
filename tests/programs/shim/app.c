/* Init, a barrier, an allreduce checked against the closed form, a ring of
 * sends, Pcontrol, Finalize: enough to see order, resolution and results. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv) {
    int rank, size, sum = -1, token = -1;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) {
        MPI_Send(&rank, 1, MPI_INT, 1 % size, 7, MPI_COMM_WORLD);
        MPI_Recv(&token, 1, MPI_INT, size - 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
        MPI_Recv(&token, 1, MPI_INT, rank - 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        token += rank;
        MPI_Send(&token, 1, MPI_INT, (rank + 1) % size, 7, MPI_COMM_WORLD);
    }
    MPI_Pcontrol(2, "ignored", 3.5);
    double tick = MPI_Wtick();
    printf("shimtest app rank=%d size=%d sum=%d expected=%d token=%d wtick_ok=%d\n", rank, size, sum,
           size * (size - 1) / 2, rank == 0 ? token : -1, tick > 0.0 && tick < 1.0);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
