/* A stand-in MPI library for running the aarch64 shim under qemu-user
 * (`cargo xtask test`, xtask/src/qemu_shim.rs): not an MPI, only the shape
 * the shim looks for, so the shim's own machinery (start-up IFUNC,
 * trampolines, cold path, binding, gates) runs on aarch64 code. Each
 * procedure is defined as PMPI_X, with MPI_X a weak alias, as Open MPI and
 * MPICH define theirs, and counts its calls; the counts are printed at
 * exit. Handles are ints, as in MPICH. */
#include <stdio.h>

static long inits, sends, ranks, finalizes;

int PMPI_Init(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    inits++;
    return 0;
}
int PMPI_Comm_rank(int comm, int *rank) {
    (void)comm;
    ranks++;
    *rank = 0;
    return 0;
}
/* Answers 0 only for the arguments app.c passes: they arrive unchanged
 * through the trampoline, the tool and the library gate. */
int PMPI_Send(const void *buf, int count, int type, int dest, int tag, int comm) {
    (void)buf;
    sends++;
    return count == 3 && type == 11 && dest == 1 && tag == 42 && comm == 7 ? 0 : 99;
}
int PMPI_Finalize(void) {
    finalizes++;
    return 0;
}

int MPI_Init(int *, char ***) __attribute__((weak, alias("PMPI_Init")));
int MPI_Comm_rank(int, int *) __attribute__((weak, alias("PMPI_Comm_rank")));
int MPI_Send(const void *, int, int, int, int, int) __attribute__((weak, alias("PMPI_Send")));
int MPI_Finalize(void) __attribute__((weak, alias("PMPI_Finalize")));

__attribute__((destructor)) static void report(void) {
    printf("library: init=%ld comm_rank=%ld send=%ld finalize=%ld\n", inits, ranks, sends,
           finalizes);
}
