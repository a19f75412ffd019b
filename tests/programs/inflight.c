/* A call in flight when the probes go in must not be counted or timed.
 *
 * usage: inflight GOFILE
 * Rank 1 enters MPI_Recv at once and blocks in it; rank 0 waits for GOFILE
 * (without MPI calls), then sends the message that completes that receive.
 * Then every rank makes 10 MPI_Barrier calls. With the observer attached
 * between READY and GOFILE, rank 1's MPI_Recv began before the probes. */
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, v = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    printf("READY %d %d\n", rank, (int)getpid());
    fflush(stdout);
    if (rank == 1) {
        MPI_Recv(&v, 1, MPI_INT, 0, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        if (v != 42) return 3;
    } else if (rank == 0) {
        while (access(argv[1], F_OK) != 0) usleep(20000);
        v = 42;
        MPI_Send(&v, 1, MPI_INT, 1, 9, MPI_COMM_WORLD);
    } else {
        while (access(argv[1], F_OK) != 0) usleep(20000);
    }
    for (int i = 0; i < 10; i++) MPI_Barrier(MPI_COMM_WORLD);
    printf("OK %d\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
