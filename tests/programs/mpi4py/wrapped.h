/* The MPI procedures both mpi4py-suite tools wrap, as one X-macro list:
 *   W(NAME, (parameters), (arguments))
 * so count.c and check.c wrap exactly the same set, and their per-function
 * call counts in one process must agree (every call passes every layer).
 * The large-count (_c) forms exist from MPI 4.0 on (MPICH 5; not Open MPI
 * 5.0, which reports MPI 3.1). Open MPI 5.0's mpi.h and MPICH 5's declare
 * these with the same types; array parameters are written as pointers. */
#include <mpi.h>

#define WRAPPED_COMMON(W)                                                                          \
    W(MPI_Send, (const void *buf, int count, MPI_Datatype dt, int dest, int tag, MPI_Comm comm),   \
      (buf, count, dt, dest, tag, comm))                                                           \
    W(MPI_Recv,                                                                                    \
      (void *buf, int count, MPI_Datatype dt, int src, int tag, MPI_Comm comm, MPI_Status *st),    \
      (buf, count, dt, src, tag, comm, st))                                                        \
    W(MPI_Isend,                                                                                   \
      (const void *buf, int count, MPI_Datatype dt, int dest, int tag, MPI_Comm comm,              \
       MPI_Request *req),                                                                          \
      (buf, count, dt, dest, tag, comm, req))                                                      \
    W(MPI_Irecv,                                                                                   \
      (void *buf, int count, MPI_Datatype dt, int src, int tag, MPI_Comm comm, MPI_Request *req),  \
      (buf, count, dt, src, tag, comm, req))                                                       \
    W(MPI_Sendrecv,                                                                                \
      (const void *sbuf, int scount, MPI_Datatype sdt, int dest, int stag, void *rbuf, int rcount, \
       MPI_Datatype rdt, int src, int rtag, MPI_Comm comm, MPI_Status *st),                        \
      (sbuf, scount, sdt, dest, stag, rbuf, rcount, rdt, src, rtag, comm, st))                     \
    W(MPI_Probe, (int src, int tag, MPI_Comm comm, MPI_Status *st), (src, tag, comm, st))          \
    W(MPI_Iprobe, (int src, int tag, MPI_Comm comm, int *flag, MPI_Status *st),                    \
      (src, tag, comm, flag, st))                                                                  \
    W(MPI_Wait, (MPI_Request * req, MPI_Status *st), (req, st))                                    \
    W(MPI_Waitall, (int n, MPI_Request *reqs, MPI_Status *sts), (n, reqs, sts))                    \
    W(MPI_Test, (MPI_Request * req, int *flag, MPI_Status *st), (req, flag, st))                   \
    W(MPI_Barrier, (MPI_Comm comm), (comm))                                                        \
    W(MPI_Ibarrier, (MPI_Comm comm, MPI_Request *req), (comm, req))                                \
    W(MPI_Bcast, (void *buf, int count, MPI_Datatype dt, int root, MPI_Comm comm),                 \
      (buf, count, dt, root, comm))                                                                \
    W(MPI_Reduce,                                                                                  \
      (const void *sbuf, void *rbuf, int count, MPI_Datatype dt, MPI_Op op, int root,              \
       MPI_Comm comm),                                                                             \
      (sbuf, rbuf, count, dt, op, root, comm))                                                     \
    W(MPI_Allreduce,                                                                               \
      (const void *sbuf, void *rbuf, int count, MPI_Datatype dt, MPI_Op op, MPI_Comm comm),        \
      (sbuf, rbuf, count, dt, op, comm))                                                           \
    W(MPI_Allgather,                                                                               \
      (const void *sbuf, int scount, MPI_Datatype sdt, void *rbuf, int rcount, MPI_Datatype rdt,   \
       MPI_Comm comm),                                                                             \
      (sbuf, scount, sdt, rbuf, rcount, rdt, comm))                                                \
    W(MPI_Alltoall,                                                                                \
      (const void *sbuf, int scount, MPI_Datatype sdt, void *rbuf, int rcount, MPI_Datatype rdt,   \
       MPI_Comm comm),                                                                             \
      (sbuf, scount, sdt, rbuf, rcount, rdt, comm))                                                \
    W(MPI_Gather,                                                                                  \
      (const void *sbuf, int scount, MPI_Datatype sdt, void *rbuf, int rcount, MPI_Datatype rdt,   \
       int root, MPI_Comm comm),                                                                   \
      (sbuf, scount, sdt, rbuf, rcount, rdt, root, comm))                                          \
    W(MPI_Scatter,                                                                                 \
      (const void *sbuf, int scount, MPI_Datatype sdt, void *rbuf, int rcount, MPI_Datatype rdt,   \
       int root, MPI_Comm comm),                                                                   \
      (sbuf, scount, sdt, rbuf, rcount, rdt, root, comm))                                          \
    W(MPI_Comm_dup, (MPI_Comm comm, MPI_Comm * out), (comm, out))                                  \
    W(MPI_Comm_split, (MPI_Comm comm, int color, int key, MPI_Comm *out), (comm, color, key, out)) \
    W(MPI_Comm_free, (MPI_Comm * comm), (comm))

#if MPI_VERSION >= 4
#define WRAPPED_LARGE(W)                                                                           \
    W(MPI_Send_c,                                                                                  \
      (const void *buf, MPI_Count count, MPI_Datatype dt, int dest, int tag, MPI_Comm comm),       \
      (buf, count, dt, dest, tag, comm))                                                           \
    W(MPI_Recv_c,                                                                                  \
      (void *buf, MPI_Count count, MPI_Datatype dt, int src, int tag, MPI_Comm comm,               \
       MPI_Status *st),                                                                            \
      (buf, count, dt, src, tag, comm, st))                                                        \
    W(MPI_Isend_c,                                                                                 \
      (const void *buf, MPI_Count count, MPI_Datatype dt, int dest, int tag, MPI_Comm comm,        \
       MPI_Request *req),                                                                          \
      (buf, count, dt, dest, tag, comm, req))                                                      \
    W(MPI_Irecv_c,                                                                                 \
      (void *buf, MPI_Count count, MPI_Datatype dt, int src, int tag, MPI_Comm comm,               \
       MPI_Request *req),                                                                          \
      (buf, count, dt, src, tag, comm, req))                                                       \
    W(MPI_Sendrecv_c,                                                                              \
      (const void *sbuf, MPI_Count scount, MPI_Datatype sdt, int dest, int stag, void *rbuf,       \
       MPI_Count rcount, MPI_Datatype rdt, int src, int rtag, MPI_Comm comm, MPI_Status *st),      \
      (sbuf, scount, sdt, dest, stag, rbuf, rcount, rdt, src, rtag, comm, st))                     \
    W(MPI_Bcast_c, (void *buf, MPI_Count count, MPI_Datatype dt, int root, MPI_Comm comm),         \
      (buf, count, dt, root, comm))                                                                \
    W(MPI_Reduce_c,                                                                                \
      (const void *sbuf, void *rbuf, MPI_Count count, MPI_Datatype dt, MPI_Op op, int root,        \
       MPI_Comm comm),                                                                             \
      (sbuf, rbuf, count, dt, op, root, comm))                                                     \
    W(MPI_Allreduce_c,                                                                             \
      (const void *sbuf, void *rbuf, MPI_Count count, MPI_Datatype dt, MPI_Op op, MPI_Comm comm),  \
      (sbuf, rbuf, count, dt, op, comm))                                                           \
    W(MPI_Allgather_c,                                                                             \
      (const void *sbuf, MPI_Count scount, MPI_Datatype sdt, void *rbuf, MPI_Count rcount,         \
       MPI_Datatype rdt, MPI_Comm comm),                                                           \
      (sbuf, scount, sdt, rbuf, rcount, rdt, comm))                                                \
    W(MPI_Alltoall_c,                                                                              \
      (const void *sbuf, MPI_Count scount, MPI_Datatype sdt, void *rbuf, MPI_Count rcount,         \
       MPI_Datatype rdt, MPI_Comm comm),                                                           \
      (sbuf, scount, sdt, rbuf, rcount, rdt, comm))                                                \
    W(MPI_Gather_c,                                                                                \
      (const void *sbuf, MPI_Count scount, MPI_Datatype sdt, void *rbuf, MPI_Count rcount,         \
       MPI_Datatype rdt, int root, MPI_Comm comm),                                                 \
      (sbuf, scount, sdt, rbuf, rcount, rdt, root, comm))                                          \
    W(MPI_Scatter_c,                                                                               \
      (const void *sbuf, MPI_Count scount, MPI_Datatype sdt, void *rbuf, MPI_Count rcount,         \
       MPI_Datatype rdt, int root, MPI_Comm comm),                                                 \
      (sbuf, scount, sdt, rbuf, rcount, rdt, root, comm))
#else
#define WRAPPED_LARGE(W)
#endif

#define WRAPPED(W) WRAPPED_COMMON(W) WRAPPED_LARGE(W)

/* Indices and names of the wrapped procedures. */
#define WRAPPED_ENUM(NAME, P, A) IDX_##NAME,
enum { WRAPPED(WRAPPED_ENUM) N_WRAPPED };
#define WRAPPED_NAME(NAME, P, A) #NAME,
static const char *const wrapped_names[N_WRAPPED] = {WRAPPED(WRAPPED_NAME)};

/* Where a tool writes its report at exit: $MPI4PY_TOOLS_OUT/<tool>-<pid>.txt,
 * else stderr. One line of `key=value` words. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static FILE *report_open(const char *tool, char *path, size_t len) {
    const char *dir = getenv("MPI4PY_TOOLS_OUT");
    if (dir == NULL || *dir == '\0')
        return NULL;
    snprintf(path, len, "%s/%s-%d.txt", dir, tool, (int)getpid());
    return fopen(path, "w");
}
