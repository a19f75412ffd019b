/* A QMPI tool (MPICH's QMPI interface, mpi.h) that counts, per instance,
 * the calls that reach it, for tests/tests/e2e/qmpi.rs. Built the same way
 * on every MPI:
 *   mpicc $(mpi-observer qmpi-flags) -shared -fPIC -o libNAME.so qcount.c
 * (on MPICH the flags add only a build marker; on Open MPI and the
 * standard ABI they bring QMPI_Context, the MPI_X_T ids, the QMPI_X_t
 * types and the prototypes), or compiled into a program with
 * -DQTOOL_NAME='"NAME"'.
 *
 * Its constructor registers one name: QTOOL_NAME, else its own file name
 * (libNAME.so -> NAME), so copies of one build are distinct tools. Each
 * instance's init callback allocates the instance's storage, registers it
 * and the six functions below. Each function finds its storage with
 * QMPI_Get_tool_storage (and checks it is its own instance's), counts,
 * asks QMPI_Get_calling_address where the application called from, and
 * calls down the way MPICH's tools do: QMPI_Get_function(id, MPI_X_T,
 * &fn, &next), then fn(context, next, args...).
 *
 * With QCOUNT_CHATTY=NAME, the tool of that name makes two calls of its
 * own in each MPI_Send it sees, before passing it down: an MPI_Comm_rank
 * through the pointer QMPI_Get_function gives (it goes down from its
 * level) and a direct MPI_Comm_rank (a tool library's own call enters
 * below its instances). The levels below see two MPI_Comm_rank more per
 * send; the tool itself sees neither.
 *
 * With QCOUNT_CACHE=NAME, the tool of that name asks QMPI_Get_function
 * once per instance and function and keeps the answer in the instance's
 * storage, as tools do to save the lookup: the pointers, called later and
 * from any thread, must still reach the right level.
 *
 * With QCOUNT_BAD_ID set, each init callback also registers a function for
 * the id MPI_LAST_FUNC_T (one past the last procedure), and each instance
 * asks QMPI_Get_function for that id in its first MPI_Barrier (lookups
 * belong in the tool's functions, not in its init callback); both must be
 * refused.
 *
 * At exit, when QCOUNT_OUT is set, it writes "$QCOUNT_OUT.NAME.<pid>":
 *   register RC            what QMPI_Register_tool_name returned
 *   inits N                how many init callbacks ran
 *   functions RC           0 if every QMPI_Register_function succeeded
 *   badid RC               (with QCOUNT_BAD_ID) the refused registration's
 *   badget WHAT            (with QCOUNT_BAD_ID) the bad lookups: refused,
 *                          answered (one of them was not refused) or
 *                          not-asked
 *   instance ID MPI_Send=N MPI_Recv=N MPI_Allreduce=N MPI_Barrier=N
 *       MPI_Comm_rank=N MPI_Finalize=N storage_bad=N app=N elsewhere=N
 *       noaddr=N           one line per instance, in id order: its counts,
 *                          calls whose storage was not its own, and where
 *                          the calling address lay (the executable, another
 *                          object, or no answer).
 */
/* dladdr needs _GNU_SOURCE before the first system header; with the
 * forced include of mpi_observer_qmpi.h, mpi.h (and on MPICH the system
 * headers it includes) comes first, so the build passes -D_GNU_SOURCE. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <libgen.h>
#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <unistd.h>

enum { SEND, RECV, ALLREDUCE, BARRIER, COMM_RANK, FINALIZE, N };
static const char *const names[N] = {"MPI_Send",    "MPI_Recv",      "MPI_Allreduce",
                                     "MPI_Barrier", "MPI_Comm_rank", "MPI_Finalize"};

/* One instance's storage. */
struct storage {
    int id;
    unsigned long counts[N];
    unsigned long storage_bad, app, elsewhere, noaddr;
    /* With QCOUNT_CACHE: each function's next level, once asked. */
    void (*next_fn[N])(void);
    int next_id[N];
    /* With QCOUNT_BAD_ID: the bad lookup was made. */
    int bad_asked;
};

#define MAX_INSTANCES 16
static struct storage *instances[MAX_INSTANCES];
static int ninstances;
static int register_rc = -1, functions_rc, bad_tried, badid_rc;
/* -1 if a bad lookup succeeded; whether one was made. */
static int badget_rc, badget_asked;
static char name[QMPI_MAX_TOOL_NAME_LENGTH];
static int chatty, cache;
/* The executable's load address, to tell the application's call sites. */
static void *exe_base;

static void fail(const char *what, int rc) {
    fprintf(stderr, "qcount %s: %s returned %d\n", name, what, rc);
    abort();
}

static void add(unsigned long *c) { __atomic_fetch_add(c, 1, __ATOMIC_RELAXED); }

/* Counts call `f` into instance `id`'s storage, found through the context,
 * and notes where the application called from. Returns the storage, NULL
 * if it was another instance's. */
static struct storage *count(QMPI_Context ctx, int id, int f) {
    void *p = NULL;
    int rc = QMPI_Get_tool_storage(ctx, id, &p);
    if (rc != MPI_SUCCESS || p == NULL)
        fail("QMPI_Get_tool_storage", rc);
    struct storage *s = p;
    if (s->id != id) {
        /* Another instance's storage: count it in the right one's. */
        for (int i = 0; i < ninstances; i++)
            if (instances[i]->id == id)
                add(&instances[i]->storage_bad);
        return NULL;
    }
    add(&s->counts[f]);
    void *where = NULL;
    if (QMPI_Get_calling_address(ctx, &where) != MPI_SUCCESS || where == NULL) {
        add(&s->noaddr);
        return s;
    }
    /* A malloc'd string "0x...", as MPICH gives it. */
    char *end = NULL;
    unsigned long long a = strtoull((const char *)where, &end, 16);
    int text = strncmp((const char *)where, "0x", 2) == 0 && end != NULL && *end == '\0';
    free(where);
    Dl_info info;
    if (!text || a == 0 || dladdr((void *)(uintptr_t)a, &info) == 0)
        add(&s->noaddr);
    else if (info.dli_fbase == exe_base)
        add(&s->app);
    else
        add(&s->elsewhere);
    return s;
}

/* The next level's function for procedure `t` (our index `f`) below
 * instance `id`: asked each time, or with QCOUNT_CACHE once per instance
 * (several threads may ask at once: they get the same answer). */
static void next_level(struct storage *s, int id, int f, enum QMPI_Functions_enum t,
                       void (**fn)(void), int *next_id) {
    if (cache && s != NULL) {
        void (*known)(void) = __atomic_load_n(&s->next_fn[f], __ATOMIC_ACQUIRE);
        if (known != NULL) {
            *fn = known;
            *next_id = __atomic_load_n(&s->next_id[f], __ATOMIC_RELAXED);
            return;
        }
    }
    int rc = QMPI_Get_function(id, t, fn, next_id);
    if (rc != MPI_SUCCESS || *fn == NULL)
        fail("QMPI_Get_function", rc);
    if (cache && s != NULL) {
        __atomic_store_n(&s->next_id[f], *next_id, __ATOMIC_RELAXED);
        __atomic_store_n(&s->next_fn[f], *fn, __ATOMIC_RELEASE);
    }
}

#define NEXT(F, T, TYPE)                                                                           \
    TYPE *next;                                                                                    \
    int next_id;                                                                                   \
    next_level(s, id, F, T, (void (**)(void)) & next, &next_id)

static int q_send(QMPI_Context ctx, int id, const void *buf, int n, MPI_Datatype dt, int dest,
                  int tag, MPI_Comm comm) {
    struct storage *s = count(ctx, id, SEND);
    if (chatty) {
        int r;
        NEXT(COMM_RANK, MPI_COMM_RANK_T, QMPI_Comm_rank_t);
        next(ctx, next_id, comm, &r);
        MPI_Comm_rank(comm, &r);
    }
    NEXT(SEND, MPI_SEND_T, QMPI_Send_t);
    return next(ctx, next_id, buf, n, dt, dest, tag, comm);
}

static int q_recv(QMPI_Context ctx, int id, void *buf, int n, MPI_Datatype dt, int src, int tag,
                  MPI_Comm comm, MPI_Status *st) {
    struct storage *s = count(ctx, id, RECV);
    NEXT(RECV, MPI_RECV_T, QMPI_Recv_t);
    return next(ctx, next_id, buf, n, dt, src, tag, comm, st);
}

static int q_allreduce(QMPI_Context ctx, int id, const void *sb, void *rb, int n,
                       MPI_Datatype dt, MPI_Op op, MPI_Comm comm) {
    struct storage *s = count(ctx, id, ALLREDUCE);
    NEXT(ALLREDUCE, MPI_ALLREDUCE_T, QMPI_Allreduce_t);
    return next(ctx, next_id, sb, rb, n, dt, op, comm);
}

static int q_barrier(QMPI_Context ctx, int id, MPI_Comm comm) {
    struct storage *s = count(ctx, id, BARRIER);
    if (bad_tried && s != NULL && !__atomic_exchange_n(&s->bad_asked, 1, __ATOMIC_RELAXED)) {
        void (*fn)(void) = NULL;
        int bad_next = -1;
        /* Each instance's answer: all of them must be refusals. */
        int rc = QMPI_Get_function(id, MPI_LAST_FUNC_T, &fn, &bad_next);
        __atomic_fetch_or(&badget_rc, rc == MPI_SUCCESS ? -1 : 0, __ATOMIC_RELAXED);
        __atomic_store_n(&badget_asked, 1, __ATOMIC_RELAXED);
    }
    NEXT(BARRIER, MPI_BARRIER_T, QMPI_Barrier_t);
    return next(ctx, next_id, comm);
}

static int q_comm_rank(QMPI_Context ctx, int id, MPI_Comm comm, int *rank) {
    struct storage *s = count(ctx, id, COMM_RANK);
    NEXT(COMM_RANK, MPI_COMM_RANK_T, QMPI_Comm_rank_t);
    return next(ctx, next_id, comm, rank);
}

static int q_finalize(QMPI_Context ctx, int id) {
    struct storage *s = count(ctx, id, FINALIZE);
    NEXT(FINALIZE, MPI_FINALIZE_T, QMPI_Finalize_t);
    return next(ctx, next_id);
}

static void init(int id) {
    struct storage *s = calloc(1, sizeof *s);
    if (s == NULL || ninstances == MAX_INSTANCES)
        abort();
    s->id = id;
    instances[ninstances++] = s;
    int rc = QMPI_Register_tool_storage(id, s);
    if (rc != MPI_SUCCESS)
        fail("QMPI_Register_tool_storage", rc);
    const struct {
        enum QMPI_Functions_enum t;
        void (*fn)(void);
    } fns[N] = {
        {MPI_SEND_T, (void (*)(void))q_send},
        {MPI_RECV_T, (void (*)(void))q_recv},
        {MPI_ALLREDUCE_T, (void (*)(void))q_allreduce},
        {MPI_BARRIER_T, (void (*)(void))q_barrier},
        {MPI_COMM_RANK_T, (void (*)(void))q_comm_rank},
        {MPI_FINALIZE_T, (void (*)(void))q_finalize},
    };
    for (int i = 0; i < N; i++)
        functions_rc |= QMPI_Register_function(id, fns[i].t, fns[i].fn);
    if (getenv("QCOUNT_BAD_ID") != NULL) {
        bad_tried = 1;
        badid_rc = QMPI_Register_function(id, MPI_LAST_FUNC_T, (void (*)(void))q_send);
    }
}

__attribute__((constructor)) static void setup(void) {
#ifdef QTOOL_NAME
    snprintf(name, sizeof name, "%s", QTOOL_NAME);
#else
    Dl_info info;
    if (dladdr((void *)&setup, &info) == 0 || info.dli_fname == NULL)
        abort();
    char file[PATH_MAX];
    snprintf(file, sizeof file, "%s", info.dli_fname);
    char *n = basename(file);
    if (strncmp(n, "lib", 3) == 0)
        n += 3;
    char *dot = strchr(n, '.');
    if (dot != NULL)
        *dot = '\0';
    snprintf(name, sizeof name, "%s", n);
#endif
    const char *chat = getenv("QCOUNT_CHATTY");
    chatty = chat != NULL && strcmp(chat, name) == 0;
    const char *keep = getenv("QCOUNT_CACHE");
    cache = keep != NULL && strcmp(keep, name) == 0;
    Dl_info exe;
    if (dladdr((void *)getauxval(AT_PHDR), &exe) != 0)
        exe_base = exe.dli_fbase;
    register_rc = QMPI_Register_tool_name(name, init);
}

__attribute__((destructor)) static void report(void) {
    const char *prefix = getenv("QCOUNT_OUT");
    if (prefix == NULL)
        return;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s.%s.%d", prefix, name, (int)getpid());
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        perror(path);
        abort();
    }
    fprintf(f, "register %d\ninits %d\nfunctions %d\n", register_rc, ninstances, functions_rc);
    if (bad_tried)
        fprintf(f, "badid %d\nbadget %s\n", badid_rc,
                !badget_asked ? "not-asked" : badget_rc == 0 ? "refused" : "answered");
    for (int i = 0; i < ninstances; i++) {
        const struct storage *s = instances[i];
        fprintf(f, "instance %d", s->id);
        for (int k = 0; k < N; k++)
            fprintf(f, " %s=%lu", names[k], s->counts[k]);
        fprintf(f, " storage_bad=%lu app=%lu elsewhere=%lu noaddr=%lu\n", s->storage_bad, s->app,
                s->elsewhere, s->noaddr);
    }
    fclose(f);
}
