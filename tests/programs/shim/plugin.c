/* A plugin linked with the MPI library, which a program that is not loads
 * with dlopen (dlmain.c): the MPI library arrives as the plugin's
 * dependency, inside that dlopen. Its calls must still go through the shim. */
#include <mpi.h>
#include <stdio.h>

int plugin_run(void) {
    int argc = 0;
    char **argv = NULL;
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    printf("done %d of %d\n", rank, size);
    return 0;
}
