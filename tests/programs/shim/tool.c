/* A PMPI tool for the shim's tests, compiled once per name:
 *   mpicc -shared -fPIC -DTOOL='"A"' [-DBARRIER_IN_ALLREDUCE] -o libtoolA.so tool.c
 * It logs Init/Finalize order and its level's view of Barrier, and counts
 * calls exactly (atomics: the thread test calls from four threads). Counts
 * are printed from a destructor, so they appear even when the tool never
 * sees MPI_Finalize (Fortran layer placed above it). */
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>

#ifndef TOOL
#error "define TOOL as a string"
#endif

static long sends, recvs, barriers, barriers_in_own_allreduce, allreduces, ranks, pcontrols;
static __thread int in_allreduce;

static void say(const char *what) {
    printf("shimtest pid=%d tool=%s %s\n", (int)getpid(), TOOL, what);
    fflush(stdout);
}

int MPI_Init(int *argc, char ***argv) {
    say("before MPI_Init");
    int rc = PMPI_Init(argc, argv);
    say("after MPI_Init");
    return rc;
}

int MPI_Init_thread(int *argc, char ***argv, int required, int *provided) {
    say("before MPI_Init_thread");
    int rc = PMPI_Init_thread(argc, argv, required, provided);
    say("after MPI_Init_thread");
    return rc;
}

int MPI_Finalize(void) {
    say("before MPI_Finalize");
    int rc = PMPI_Finalize();
    say("after MPI_Finalize");
    return rc;
}

int MPI_Send(const void *buf, int count, MPI_Datatype dt, int dest, int tag, MPI_Comm comm) {
    __atomic_fetch_add(&sends, 1, __ATOMIC_RELAXED);
    return PMPI_Send(buf, count, dt, dest, tag, comm);
}

int MPI_Recv(void *buf, int count, MPI_Datatype dt, int src, int tag, MPI_Comm comm, MPI_Status *st) {
    __atomic_fetch_add(&recvs, 1, __ATOMIC_RELAXED);
    return PMPI_Recv(buf, count, dt, src, tag, comm, st);
}

int MPI_Comm_rank(MPI_Comm comm, int *rank) {
    __atomic_fetch_add(&ranks, 1, __ATOMIC_RELAXED);
    return PMPI_Comm_rank(comm, rank);
}

int MPI_Barrier(MPI_Comm comm) {
    __atomic_fetch_add(&barriers, 1, __ATOMIC_RELAXED);
    if (in_allreduce)
        __atomic_fetch_add(&barriers_in_own_allreduce, 1, __ATOMIC_RELAXED);
    return PMPI_Barrier(comm);
}

int MPI_Allreduce(const void *sb, void *rb, int n, MPI_Datatype dt, MPI_Op op, MPI_Comm comm) {
    __atomic_fetch_add(&allreduces, 1, __ATOMIC_RELAXED);
#ifdef BARRIER_IN_ALLREDUCE
    /* The seed's example: a wrapper that calls MPI_ (not PMPI_) must reach
     * its own wrapper, at its own level. */
    in_allreduce = 1;
    MPI_Barrier(comm);
    in_allreduce = 0;
#endif
    return PMPI_Allreduce(sb, rb, n, dt, op, comm);
}

int MPI_Pcontrol(const int level, ...) {
    __atomic_fetch_add(&pcontrols, 1, __ATOMIC_RELAXED);
    char msg[64];
    snprintf(msg, sizeof msg, "MPI_Pcontrol level=%d", level);
    say(msg);
    return MPI_SUCCESS;
}

__attribute__((destructor)) static void report(void) {
    printf("shimtest pid=%d tool=%s counts send=%ld recv=%ld barrier=%ld barrier_in_own_allreduce=%ld "
           "allreduce=%ld comm_rank=%ld pcontrol=%ld\n",
           (int)getpid(), TOOL, sends, recvs, barriers, barriers_in_own_allreduce, allreduces, ranks, pcontrols);
    fflush(stdout);
}
