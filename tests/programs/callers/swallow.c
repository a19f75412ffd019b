/* A PMPI tool whose MPI_Comm_rank never calls PMPI: it answers
 * MPI_COMM_WORLD's rank from a cache filled once, by its own
 * PMPI_Comm_rank after MPI_Init (the only Comm_rank the levels below it
 * see). Other communicators pass down.
 *   mpicc -shared -fPIC -g -O1 -o libswallow.so swallow.c
 */
#include <mpi.h>

static int world_rank = -1;

int MPI_Init(int *argc, char ***argv) {
    int rc = PMPI_Init(argc, argv);
    if (rc == MPI_SUCCESS)
        PMPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    return rc;
}

int MPI_Init_thread(int *argc, char ***argv, int required, int *provided) {
    int rc = PMPI_Init_thread(argc, argv, required, provided);
    if (rc == MPI_SUCCESS)
        PMPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    return rc;
}

int MPI_Comm_rank(MPI_Comm comm, int *rank) {
    if (comm == MPI_COMM_WORLD && world_rank >= 0) {
        *rank = world_rank;
        return MPI_SUCCESS;
    }
    return PMPI_Comm_rank(comm, rank);
}
