/* A PMPI tool whose MPI_Send wrapper makes MPI calls of its own: one
 * MPI_Comm_size (through the MPI_ name: it enters the stack at this level,
 * so the levels below see it and the levels above do not) and one
 * PMPI_Type_size (straight to the next level below), before passing the
 * send down. A send whose size disagrees with its datatype aborts.
 *   mpicc -shared -fPIC -g -O1 -o libextra.so extra.c
 */
#include <mpi.h>
#include <stdio.h>

int MPI_Send(const void *buf, int count, MPI_Datatype dt, int dest, int tag, MPI_Comm comm) {
    int size = 0, bytes = 0;
    if (MPI_Comm_size(comm, &size) != MPI_SUCCESS || dest >= size || PMPI_Type_size(dt, &bytes) != MPI_SUCCESS ||
        bytes <= 0) {
        fprintf(stderr, "extra: MPI_Send to %d of %d, datatype of %d bytes\n", dest, size, bytes);
        PMPI_Abort(comm, 3);
    }
    return PMPI_Send(buf, count, dt, dest, tag, comm);
}
