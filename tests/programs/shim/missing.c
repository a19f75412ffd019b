/* A PMPI tool whose MPI_Barrier calls PMPI_Abi_get_version (MPI 5.0), which
 * neither Open MPI 4.1 nor MPICH 4.0 implements. The application cannot see
 * a procedure its library lacks (tests/tests/shim_symbols.rs), but a tool is
 * loaded with every export visible, so its reference binds to the shim: the
 * call must end the process with one line naming the procedure. Declared
 * here because neither mpi.h does. */
#include <mpi.h>
#include <stdio.h>

int PMPI_Abi_get_version(int *major, int *minor);

int MPI_Barrier(MPI_Comm comm) {
    int major = 0, minor = 0;
    PMPI_Abi_get_version(&major, &minor);
    printf("shimtest missing: returned %d.%d\n", major, minor);
    return PMPI_Barrier(comm);
}
