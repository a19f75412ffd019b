/* Calls MPI_Abi_get_version (MPI 5.0), which neither Open MPI 4.1 nor
 * MPICH 4.0 implements: through the shim (found with dlsym, since neither
 * mpi.h declares it) the call must end the process with one line naming it. */
#include <dlfcn.h>
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int (*get_version)(int *, int *) = (int (*)(int *, int *))dlsym(RTLD_DEFAULT, "MPI_Abi_get_version");
    if (!get_version) {
        printf("shimtest missing: no MPI_Abi_get_version symbol at all\n");
        return 2;
    }
    int major = 0, minor = 0;
    get_version(&major, &minor);
    printf("shimtest missing: returned %d.%d\n", major, minor);
    MPI_Finalize();
    return 0;
}
