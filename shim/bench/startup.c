/* Start-up cost: a program linked with the MPI library that exits without
 * calling MPI, so a spawn measures loading, relocation and, under the shim,
 * the hiding of the names the library lacks (shim/src/exports.rs). The MPI
 * call keeps the library linked under --as-needed. */
#include <mpi.h>

int main(int argc, char **argv) {
    if (argc > 99)
        MPI_Init(&argc, &argv);
    return 0;
}
