/* Probes, the way libraries that support several MPI versions do, whether
 * optional MPI procedures exist: through weak references (`#pragma weak`,
 * `if (fn)`) and through dlsym. Prints one line per name; the test runs it
 * bare and under the shim and requires the same lines.
 *
 * The weak references are declared through asm labels, so no mpi.h
 * prototype (or its absence, in an older MPI) conflicts with them. */
#include <dlfcn.h>
#include <mpi.h>
#include <stdio.h>

#define WEAK(c, sym) extern void c(void) __asm__(sym) __attribute__((weak))
WEAK(w_abi_get_version, "MPI_Abi_get_version");
WEAK(w_pabi_get_version, "PMPI_Abi_get_version");
WEAK(w_isendrecv, "MPI_Isendrecv");
WEAK(w_session_init, "MPI_Session_init");
WEAK(w_comm_attach_buffer, "MPI_Comm_attach_buffer");
WEAK(w_send, "MPI_Send");
WEAK(w_psend, "PMPI_Send");
WEAK(w_f_send, "mpi_send_");
WEAK(w_f_abi, "mpi_abi_get_version_");
WEAK(w_f_upper, "MPI_ABI_GET_VERSION");
WEAK(w_f08ts, "mpi_send_f08ts_");

struct probe {
    const char *name;
    void (*weak)(void);
};

/* Built with -DAS_LIBRARY, this is a shared library's function that
 * weakmain.c calls, so the references are a library's, bound before the
 * program's. */
#ifdef AS_LIBRARY
int weak_probe_main(int argc, char **argv) {
#else
int main(int argc, char **argv) {
#endif
    const struct probe probes[] = {
        {"MPI_Abi_get_version", w_abi_get_version},
        {"PMPI_Abi_get_version", w_pabi_get_version},
        {"MPI_Isendrecv", w_isendrecv},
        {"MPI_Session_init", w_session_init},
        {"MPI_Comm_attach_buffer", w_comm_attach_buffer},
        {"MPI_Send", w_send},
        {"PMPI_Send", w_psend},
        {"mpi_send_", w_f_send},
        {"mpi_abi_get_version_", w_f_abi},
        {"MPI_ABI_GET_VERSION", w_f_upper},
        {"mpi_send_f08ts_", w_f08ts},
    };
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) {
        for (unsigned i = 0; i < sizeof probes / sizeof probes[0]; i++) {
            dlerror();
            void *d = dlsym(RTLD_DEFAULT, probes[i].name);
            /* A null dlsym answer must come with an error, as without the
             * shim: CPython's ctypes crashes on a null without one. */
            const char *err = dlerror();
            printf("PROBE %s weak=%s dlsym=%s\n", probes[i].name,
                   probes[i].weak ? "present" : "null",
                   d ? "present" : (err ? "absent" : "null-without-error"));
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    if (rank == 0)
        printf("done\n");
    return 0;
}
