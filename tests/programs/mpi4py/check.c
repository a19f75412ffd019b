/* PMPI tool "check" for the mpi4py suite under the shim (tests/tests/mpi4py.rs):
 *   mpicc -shared -fPIC -o libm4pcheck.so check.c
 * Wraps the same procedures as count.c (wrapped.h) and checks, around each
 * PMPI_ call, what a layer below another layer must see:
 *   - calls per procedure (the test compares them with count's, which sits
 *     above it with `stats` between them: every call must pass every layer);
 *   - the return code: MPI_SUCCESS or a valid error code (error codes are
 *     expected, the suite tests error paths); anything outside
 *     [0, MPI_ERR_LASTCODE] is `badrc` (codes the library added with
 *     MPI_Add_error_code are above it, so only negative ones are counted);
 *   - calls before MPI_Init* returned (`early`), per-thread nesting of its
 *     own wrappers (`maxdepth`: above 1 means a wrapped call was made from
 *     inside another one on the same thread, e.g. from a callback).
 * Writes one line at exit (see report_open in wrapped.h):
 *   tool=check pid=P rank=R spawned=0|1 init=N finalize=N badrc=N early=N
 *   maxdepth=N errors=N MPI_Send=N ... */
#include "wrapped.h"

static long calls[N_WRAPPED];
static long errors, badrc, early;
static int rank = -1, spawned = -1, inits, finalizes, initialized, maxdepth;
static __thread int depth;

static void enter(int idx) {
    __atomic_fetch_add(&calls[idx], 1, __ATOMIC_RELAXED);
    if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE))
        __atomic_fetch_add(&early, 1, __ATOMIC_RELAXED);
    int d = ++depth;
    int m = __atomic_load_n(&maxdepth, __ATOMIC_RELAXED);
    while (d > m && !__atomic_compare_exchange_n(&maxdepth, &m, d, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

static int leave(int rc) {
    depth--;
    if (rc != MPI_SUCCESS)
        __atomic_fetch_add(&errors, 1, __ATOMIC_RELAXED);
    if (rc < 0)
        __atomic_fetch_add(&badrc, 1, __ATOMIC_RELAXED);
    return rc;
}

#define CHECK(NAME, PARAMS, ARGS)                                                                  \
    int NAME PARAMS {                                                                              \
        enter(IDX_##NAME);                                                                         \
        return leave(P##NAME ARGS);                                                                \
    }
WRAPPED(CHECK)

static void after_init(int rc) {
    if (rc != MPI_SUCCESS)
        return;
    MPI_Comm parent = MPI_COMM_NULL;
    inits++;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    PMPI_Comm_get_parent(&parent);
    spawned = parent != MPI_COMM_NULL;
    __atomic_store_n(&initialized, 1, __ATOMIC_RELEASE);
}

int MPI_Init(int *argc, char ***argv) {
    int rc = PMPI_Init(argc, argv);
    after_init(rc);
    return rc;
}

int MPI_Init_thread(int *argc, char ***argv, int required, int *provided) {
    int rc = PMPI_Init_thread(argc, argv, required, provided);
    after_init(rc);
    return rc;
}

int MPI_Finalize(void) {
    finalizes++;
    return PMPI_Finalize();
}

__attribute__((destructor)) static void report(void) {
    char path[4096];
    FILE *f = report_open("check", path, sizeof path);
    FILE *out = f ? f : stderr;
    fprintf(out,
            "tool=check pid=%d rank=%d spawned=%d init=%d finalize=%d badrc=%ld "
            "early=%ld maxdepth=%d errors=%ld",
            (int)getpid(), rank, spawned, inits, finalizes, badrc, early, maxdepth, errors);
    for (int i = 0; i < N_WRAPPED; i++)
        fprintf(out, " %s=%ld", wrapped_names[i], calls[i]);
    fprintf(out, "\n");
    if (f)
        fclose(f);
    else
        fflush(stderr);
}
