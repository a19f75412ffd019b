/* A pass-through PMPI tool for `cargo xtask bench shim`: each wrapper only
 * continues to the next level, so what a stack of these costs is the
 * layering itself (the tool's own call plus the shim's dispatch). */
#include <mpi.h>

int MPI_Comm_rank(MPI_Comm comm, int *rank) { return PMPI_Comm_rank(comm, rank); }

int MPI_Send(const void *buf, int count, MPI_Datatype dt, int dest, int tag, MPI_Comm comm) {
    return PMPI_Send(buf, count, dt, dest, tag, comm);
}

int MPI_Recv(void *buf, int count, MPI_Datatype dt, int src, int tag, MPI_Comm comm, MPI_Status *st) {
    return PMPI_Recv(buf, count, dt, src, tag, comm, st);
}
