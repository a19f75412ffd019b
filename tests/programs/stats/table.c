/* The request table's bound: rank 0 posts 5000 receives from rank 1, more
 * than the 4096-slot table holds, prints READY and holds them until the go
 * file (argv[1]); rank 1 then sends them and rank 0 completes them all with
 * one Waitall (larger than the layer's on-stack scratch). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define N 5000

int main(int argc, char **argv) {
    int rank;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int *in = calloc(N, sizeof(int));
    MPI_Request *r = malloc(N * sizeof(MPI_Request));
    if (rank == 0)
        for (int i = 0; i < N; i++)
            MPI_Irecv(&in[i], 1, MPI_INT, 1, 7, MPI_COMM_WORLD, &r[i]);
    const char *go = argc > 1 ? argv[1] : NULL;
    printf("READY %d %d\n", rank, (int)getpid());
    fflush(stdout);
    while (go && access(go, F_OK) != 0)
        usleep(20000);
    if (rank == 1)
        for (int i = 0; i < N; i++)
            MPI_Send(&i, 1, MPI_INT, 0, 7, MPI_COMM_WORLD);
    if (rank == 0) {
        MPI_Waitall(N, r, MPI_STATUSES_IGNORE);
        for (int i = 0; i < N; i++)
            if (in[i] != i)
                MPI_Abort(MPI_COMM_WORLD, 2);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    printf("DONE %d\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
