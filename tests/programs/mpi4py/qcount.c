/* QMPI tool "qcount" for the mpi4py suite under the shim (tests/tests/mpi4py.rs):
 *   mpicc $(mpi-observer qmpi-flags) -shared -fPIC -o libm4pqcount.so qcount.c
 * The QMPI twin of count.c for a subset of its procedures: each function
 * counts the call (atomically: the suite has threaded tests) in its
 * instance's storage and continues at the next level QMPI_Get_function
 * names. Listed in MPI_TOOLS_ENTRY right below count, it must see exactly
 * the calls count sees. Writes one line at exit (report_open, wrapped.h):
 *   tool=qcount pid=P instances=N MPI_Send=N ... */
#include "wrapped.h"

#define QPARAMS(...) (QMPI_Context ctx_, int id_, __VA_ARGS__)
#define QARGS(...) (ctx_, next_, __VA_ARGS__)

/* QW(NAME, ID, PARAMS, ARGS): the procedures, with their QMPI ids. */
#define QWRAPPED(QW)                                                                               \
    QW(MPI_Send, MPI_SEND_T,                                                                       \
       (const void *buf, int count, MPI_Datatype dt, int dest, int tag, MPI_Comm comm),            \
       (buf, count, dt, dest, tag, comm))                                                          \
    QW(MPI_Recv, MPI_RECV_T,                                                                       \
       (void *buf, int count, MPI_Datatype dt, int src, int tag, MPI_Comm comm, MPI_Status *st),   \
       (buf, count, dt, src, tag, comm, st))                                                       \
    QW(MPI_Isend, MPI_ISEND_T,                                                                     \
       (const void *buf, int count, MPI_Datatype dt, int dest, int tag, MPI_Comm comm,             \
        MPI_Request *req),                                                                         \
       (buf, count, dt, dest, tag, comm, req))                                                     \
    QW(MPI_Irecv, MPI_IRECV_T,                                                                     \
       (void *buf, int count, MPI_Datatype dt, int src, int tag, MPI_Comm comm, MPI_Request *req), \
       (buf, count, dt, src, tag, comm, req))                                                      \
    QW(MPI_Sendrecv, MPI_SENDRECV_T,                                                               \
       (const void *sbuf, int scount, MPI_Datatype sdt, int dest, int stag, void *rbuf,            \
        int rcount, MPI_Datatype rdt, int src, int rtag, MPI_Comm comm, MPI_Status *st),           \
       (sbuf, scount, sdt, dest, stag, rbuf, rcount, rdt, src, rtag, comm, st))                    \
    QW(MPI_Barrier, MPI_BARRIER_T, (MPI_Comm comm), (comm))                                        \
    QW(MPI_Bcast, MPI_BCAST_T, (void *buf, int count, MPI_Datatype dt, int root, MPI_Comm comm),   \
       (buf, count, dt, root, comm))                                                               \
    QW(MPI_Allreduce, MPI_ALLREDUCE_T,                                                             \
       (const void *sbuf, void *rbuf, int count, MPI_Datatype dt, MPI_Op op, MPI_Comm comm),       \
       (sbuf, rbuf, count, dt, op, comm))                                                          \
    QW(MPI_Comm_dup, MPI_COMM_DUP_T, (MPI_Comm comm, MPI_Comm *out), (comm, out))                  \
    QW(MPI_Comm_free, MPI_COMM_FREE_T, (MPI_Comm * comm), (comm))

#define QINDEX(NAME, ID, PARAMS, ARGS) Q_##NAME,
enum { QWRAPPED(QINDEX) N_QWRAPPED };
#define QNAME(NAME, ID, PARAMS, ARGS) #NAME,
static const char *const qnames[N_QWRAPPED] = {QWRAPPED(QNAME)};

/* One instance's counts: its storage. */
struct counts {
    long calls[N_QWRAPPED];
};
static struct counts instances[8];
static int n_instances;

#define QCOUNT(NAME, ID, PARAMS, ARGS)                                                             \
    static int q_##NAME QPARAMS PARAMS {                                                           \
        void *storage = NULL;                                                                      \
        void (*f)(void) = NULL;                                                                    \
        int next_ = 0;                                                                             \
        QMPI_Get_tool_storage(ctx_, id_, &storage);                                                \
        __atomic_fetch_add(&((struct counts *)storage)->calls[Q_##NAME], 1, __ATOMIC_RELAXED);     \
        QMPI_Get_function(id_, ID, &f, &next_);                                                    \
        return ((int(*) QPARAMS PARAMS)f)QARGS ARGS;                                               \
    }
QWRAPPED(QCOUNT)

#define QREGISTER(NAME, ID, PARAMS, ARGS)                                                          \
    QMPI_Register_function(id, ID, (void (*)(void))q_##NAME);

static void init(int id) {
    if (n_instances == 8)
        return;
    QMPI_Register_tool_storage(id, &instances[n_instances++]);
    QWRAPPED(QREGISTER)
}

__attribute__((constructor)) static void registration(void) {
    QMPI_Register_tool_name("qcount", init);
}

__attribute__((destructor)) static void report(void) {
    char path[4096];
    FILE *f = report_open("qcount", path, sizeof path);
    FILE *out = f ? f : stderr;
    fprintf(out, "tool=qcount pid=%d instances=%d", (int)getpid(), n_instances);
    for (int i = 0; i < N_QWRAPPED; i++)
        fprintf(out, " %s=%ld", qnames[i], n_instances ? instances[0].calls[i] : -1L);
    fprintf(out, "\n");
    if (f)
        fclose(f);
    else
        fflush(stderr);
}
