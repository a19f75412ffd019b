/* PMPI tool "count" for the mpi4py suite under the shim (tests/tests/mpi4py.rs):
 *   mpicc -shared -fPIC -o libm4pcount.so count.c
 * Counts every call of the procedures in wrapped.h (atomically: the suite
 * has threaded tests) and forwards it with PMPI_; notes its rank, whether
 * the process was spawned, and how often it saw MPI_Init or MPI_Init_thread
 * and MPI_Finalize.
 * Writes one line at exit (see report_open in wrapped.h):
 *   tool=count pid=P rank=R spawned=0|1 init=N finalize=N MPI_Send=N ... */
#include "wrapped.h"

static long calls[N_WRAPPED];
static int rank = -1, spawned = -1, inits, finalizes;

#define COUNT(NAME, PARAMS, ARGS)                                                                  \
    int NAME PARAMS {                                                                              \
        __atomic_fetch_add(&calls[IDX_##NAME], 1, __ATOMIC_RELAXED);                               \
        return P##NAME ARGS;                                                                       \
    }
WRAPPED(COUNT)

static void after_init(int rc) {
    if (rc != MPI_SUCCESS)
        return;
    MPI_Comm parent = MPI_COMM_NULL;
    inits++;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    PMPI_Comm_get_parent(&parent);
    spawned = parent != MPI_COMM_NULL;
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
    FILE *f = report_open("count", path, sizeof path);
    FILE *out = f ? f : stderr;
    fprintf(out, "tool=count pid=%d rank=%d spawned=%d init=%d finalize=%d", (int)getpid(), rank,
            spawned, inits, finalizes);
    for (int i = 0; i < N_WRAPPED; i++)
        fprintf(out, " %s=%ld", wrapped_names[i], calls[i]);
    fprintf(out, "\n");
    if (f)
        fclose(f);
    else
        fflush(stderr);
}
