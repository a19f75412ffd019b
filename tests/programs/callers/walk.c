/* A PMPI tool meant for low in the list: each wrapper walks the stack with
 * libunwind until the first frame whose address lies in the application's
 * executable, as a profiler that skips tool frames does, and keeps that
 * frame. At MPI_Finalize (or exit) it writes "$WALK_OUT.<pid>", one line a
 * call:
 *   walk<TAB>INDEX<TAB>TID<TAB>MAIN<TAB>FUNCTION<TAB>STEPS<TAB>OFFSET<TAB>OBJECT
 * (OFFSET and OBJECT are "-" when no frame of the executable was found
 * within MAX_STEPS), then "lost<TAB>N".
 *   mpicc -shared -fPIC -g -O1 -o libwalk.so walk.c -lunwind
 */
#define _GNU_SOURCE
#define UNW_LOCAL_ONLY
#include <libunwind.h>
#include <mpi.h>
#include <sys/types.h>

#include "frames.h"

#define MAX_STEPS 64

/* Whether `a` lies in the application's executable. */
static int in_executable(const void *a) {
    Dl_info info;
    struct link_map *lm = NULL;
    return a != NULL && dladdr1(a, &info, (void **)&lm, RTLD_DL_LINKMAP) != 0 && lm != NULL &&
           lm->l_name[0] == '\0';
}

struct call {
    const char *function;
    pid_t tid;
    int main_thread, steps;
    const void *frame;
};

static struct call calls[MAX_CALLS];
static unsigned long next_call, lost, written;

static __attribute__((noinline)) void walk(const char *function) {
    const void *found = NULL;
    int steps = 0;
    unw_context_t uc;
    unw_cursor_t cur;
    if (unw_getcontext(&uc) == 0 && unw_init_local(&cur, &uc) == 0)
        while (steps < MAX_STEPS && unw_step(&cur) > 0) {
            steps++;
            unw_word_t ip;
            unw_get_reg(&cur, UNW_REG_IP, &ip);
            if (in_executable((const void *)ip)) {
                found = (const void *)ip;
                break;
            }
        }
    unsigned long i = __atomic_fetch_add(&next_call, 1, __ATOMIC_RELAXED);
    if (i >= MAX_CALLS) {
        __atomic_fetch_add(&lost, 1, __ATOMIC_RELAXED);
        return;
    }
    calls[i] = (struct call){function, gettid(), gettid() == getpid(), steps, found};
}

static void dump(void) {
    if (__atomic_exchange_n(&written, 1, __ATOMIC_ACQ_REL))
        return;
    FILE *f = open_out("WALK_OUT");
    if (f == NULL)
        return;
    unsigned long n = next_call < MAX_CALLS ? next_call : MAX_CALLS;
    for (unsigned long i = 0; i < n; i++) {
        const struct call *c = &calls[i];
        fprintf(f, "walk\t%lu\t%d\t%d\t%s\t%d\t", i, (int)c->tid, c->main_thread, c->function, c->steps);
        put_frame(f, c->frame);
        fputc('\n', f);
    }
    fprintf(f, "lost\t%lu\n", lost);
    fclose(f);
}

__attribute__((destructor)) static void at_exit(void) { dump(); }

int MPI_Send(const void *buf, int count, MPI_Datatype dt, int dest, int tag, MPI_Comm comm) {
    walk("MPI_Send");
    return PMPI_Send(buf, count, dt, dest, tag, comm);
}

int MPI_Recv(void *buf, int count, MPI_Datatype dt, int src, int tag, MPI_Comm comm, MPI_Status *st) {
    walk("MPI_Recv");
    return PMPI_Recv(buf, count, dt, src, tag, comm, st);
}

int MPI_Sendrecv(const void *sbuf, int scount, MPI_Datatype stype, int dest, int stag, void *rbuf, int rcount,
                 MPI_Datatype rtype, int src, int rtag, MPI_Comm comm, MPI_Status *st) {
    walk("MPI_Sendrecv");
    return PMPI_Sendrecv(sbuf, scount, stype, dest, stag, rbuf, rcount, rtype, src, rtag, comm, st);
}

int MPI_Barrier(MPI_Comm comm) {
    walk("MPI_Barrier");
    return PMPI_Barrier(comm);
}

int MPI_Allreduce(const void *sb, void *rb, int n, MPI_Datatype dt, MPI_Op op, MPI_Comm comm) {
    walk("MPI_Allreduce");
    return PMPI_Allreduce(sb, rb, n, dt, op, comm);
}

int MPI_Finalize(void) {
    dump();
    return PMPI_Finalize();
}
