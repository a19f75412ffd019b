/* A PMPI tool that asks who called each of its wrappers, three ways, as
 * stack-walking profilers do (mpiP, HPCToolkit, TAU, Score-P):
 *   ra   __builtin_return_address(0)
 *   bt1  glibc backtrace(), frame 1 (bt2: frame 2)
 *   uw1  libunwind, the first frame above the wrapper (uw2: the next one)
 * It keeps one record per call and, at MPI_Finalize (or exit, if it never
 * sees MPI_Finalize), writes "$WHO_OUT.<pid>", one line per call and way:
 *   call<TAB>INDEX<TAB>TID<TAB>MAIN<TAB>FUNCTION<TAB>WAY<TAB>OFFSET<TAB>OBJECT
 * then "lost<TAB>N" (calls beyond MAX_CALLS) and "bad<TAB>N" (Sendrecv
 * calls whose status does not match their stack-passed arguments).
 *   mpicc -shared -fPIC -g -O1 -o libwho.so who.c -lunwind
 */
#define _GNU_SOURCE
#define UNW_LOCAL_ONLY
#include <execinfo.h>
#include <libunwind.h>
#include <mpi.h>
#include <sys/types.h>

#include "frames.h"

struct call {
    const char *function;
    pid_t tid;
    int main_thread;
    const void *ra, *bt[2], *uw[2];
};

static struct call calls[MAX_CALLS];
static unsigned long next_call, lost, bad, written;

static void keep(const char *function, const void *ra, void *const *bt, int nbt, const void *const *uw) {
    unsigned long i = __atomic_fetch_add(&next_call, 1, __ATOMIC_RELAXED);
    if (i >= MAX_CALLS) {
        __atomic_fetch_add(&lost, 1, __ATOMIC_RELAXED);
        return;
    }
    struct call *c = &calls[i];
    c->function = function;
    c->tid = gettid();
    c->main_thread = c->tid == getpid();
    c->ra = ra;
    c->bt[0] = nbt > 1 ? bt[1] : NULL;
    c->bt[1] = nbt > 2 ? bt[2] : NULL;
    c->uw[0] = uw[0];
    c->uw[1] = uw[1];
}

/* A macro, not a function: the three questions must be asked in the
 * wrapper's own frame. */
#define WHO(function)                                                                              \
    do {                                                                                           \
        const void *ra_ = __builtin_return_address(0);                                             \
        void *bt_[3] = {0};                                                                        \
        int nbt_ = backtrace(bt_, 3);                                                              \
        const void *uw_[2] = {0};                                                                  \
        unw_context_t uc_;                                                                         \
        unw_cursor_t cur_;                                                                         \
        if (unw_getcontext(&uc_) == 0 && unw_init_local(&cur_, &uc_) == 0)                         \
            for (int i_ = 0; i_ < 2 && unw_step(&cur_) > 0; i_++) {                                \
                unw_word_t ip_;                                                                    \
                unw_get_reg(&cur_, UNW_REG_IP, &ip_);                                              \
                uw_[i_] = (const void *)ip_;                                                       \
            }                                                                                      \
        keep(function, ra_, bt_, nbt_, uw_);                                                       \
    } while (0)

static void put_way(FILE *f, unsigned long i, const struct call *c, const char *way, const void *a) {
    fprintf(f, "call\t%lu\t%d\t%d\t%s\t%s\t", i, (int)c->tid, c->main_thread, c->function, way);
    put_frame(f, a);
    fputc('\n', f);
}

static void dump(void) {
    if (__atomic_exchange_n(&written, 1, __ATOMIC_ACQ_REL))
        return;
    FILE *f = open_out("WHO_OUT");
    if (f == NULL)
        return;
    unsigned long n = next_call < MAX_CALLS ? next_call : MAX_CALLS;
    for (unsigned long i = 0; i < n; i++) {
        const struct call *c = &calls[i];
        put_way(f, i, c, "ra", c->ra);
        put_way(f, i, c, "bt1", c->bt[0]);
        put_way(f, i, c, "bt2", c->bt[1]);
        put_way(f, i, c, "uw1", c->uw[0]);
        put_way(f, i, c, "uw2", c->uw[1]);
    }
    fprintf(f, "lost\t%lu\nbad\t%lu\n", lost, bad);
    fclose(f);
}

/* backtrace() loads libgcc_s on its first use: not inside a timed call. */
__attribute__((constructor)) static void warm(void) {
    void *b[2];
    backtrace(b, 2);
}

/* A Fortran program's MPI_Finalize may bypass this level: write at exit. */
__attribute__((destructor)) static void at_exit(void) { dump(); }

int MPI_Send(const void *buf, int count, MPI_Datatype dt, int dest, int tag, MPI_Comm comm) {
    WHO("MPI_Send");
    return PMPI_Send(buf, count, dt, dest, tag, comm);
}

int MPI_Recv(void *buf, int count, MPI_Datatype dt, int src, int tag, MPI_Comm comm, MPI_Status *st) {
    WHO("MPI_Recv");
    return PMPI_Recv(buf, count, dt, src, tag, comm, st);
}

/* Twelve arguments, the last six passed on the stack: the status must
 * name the source and tag the caller passed in them. */
int MPI_Sendrecv(const void *sbuf, int scount, MPI_Datatype stype, int dest, int stag, void *rbuf, int rcount,
                 MPI_Datatype rtype, int src, int rtag, MPI_Comm comm, MPI_Status *st) {
    WHO("MPI_Sendrecv");
    int rc = PMPI_Sendrecv(sbuf, scount, stype, dest, stag, rbuf, rcount, rtype, src, rtag, comm, st);
    if (st != MPI_STATUS_IGNORE && src != MPI_ANY_SOURCE && rtag != MPI_ANY_TAG &&
        (rc != MPI_SUCCESS || st->MPI_SOURCE != src || st->MPI_TAG != rtag))
        __atomic_fetch_add(&bad, 1, __ATOMIC_RELAXED);
    return rc;
}

int MPI_Barrier(MPI_Comm comm) {
    WHO("MPI_Barrier");
    return PMPI_Barrier(comm);
}

int MPI_Allreduce(const void *sb, void *rb, int n, MPI_Datatype dt, MPI_Op op, MPI_Comm comm) {
    WHO("MPI_Allreduce");
    return PMPI_Allreduce(sb, rb, n, dt, op, comm);
}

int MPI_Finalize(void) {
    dump();
    return PMPI_Finalize();
}
