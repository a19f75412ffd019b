/* A pass-through QMPI tool for `cargo xtask bench shim`: the QMPI twin of
 * passthrough.c. Each function asks QMPI_Get_function for the next level,
 * as MPICH's own QMPI tools do on every call, and continues there, so a
 * stack of its instances costs the QMPI layering itself. Built with the
 * header `mpi-observer qmpi-flags` names (MPI_X_T ids on every MPI). */
#include <mpi.h>

typedef int (rank_fn)(QMPI_Context, int, MPI_Comm, int *);
typedef int (send_fn)(QMPI_Context, int, const void *, int, MPI_Datatype, int, int, MPI_Comm);
typedef int (recv_fn)(QMPI_Context, int, void *, int, MPI_Datatype, int, int, MPI_Comm,
                      MPI_Status *);

static int comm_rank(QMPI_Context c, int id, MPI_Comm comm, int *rank) {
    rank_fn *f;
    int next;
    QMPI_Get_function(id, MPI_COMM_RANK_T, (void (**)(void))&f, &next);
    return f(c, next, comm, rank);
}

static int send(QMPI_Context c, int id, const void *buf, int count, MPI_Datatype dt, int dest,
                int tag, MPI_Comm comm) {
    send_fn *f;
    int next;
    QMPI_Get_function(id, MPI_SEND_T, (void (**)(void))&f, &next);
    return f(c, next, buf, count, dt, dest, tag, comm);
}

static int recv(QMPI_Context c, int id, void *buf, int count, MPI_Datatype dt, int src, int tag,
                MPI_Comm comm, MPI_Status *st) {
    recv_fn *f;
    int next;
    QMPI_Get_function(id, MPI_RECV_T, (void (**)(void))&f, &next);
    return f(c, next, buf, count, dt, src, tag, comm, st);
}

static void init(int id) {
    QMPI_Register_function(id, MPI_COMM_RANK_T, (void (*)(void))comm_rank);
    QMPI_Register_function(id, MPI_SEND_T, (void (*)(void))send);
    QMPI_Register_function(id, MPI_RECV_T, (void (*)(void))recv);
}

__attribute__((constructor)) static void registration(void) {
    QMPI_Register_tool_name("qpass", init);
}
