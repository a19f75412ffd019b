/* late_init: a rank the daemon finds before it calls MPI_Init.
 *
 * usage: late_init GOFILE
 * Every rank prints "READY <rank> <pid>" (the rank from the launcher's
 * environment), waits for GOFILE without any MPI call, then calls MPI_Init
 * and makes 10 MPI_Barrier calls 20 ms apart, prints "OK <rank>" and
 * finalises. An injection armed before MPI_Init must not stop the rank
 * there (the shim needs MPI initialised) but at its first barrier. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    const char *r = getenv("OMPI_COMM_WORLD_RANK");
    if (!r) r = getenv("PMI_RANK");
    printf("READY %s %d\n", r ? r : "0", (int)getpid());
    fflush(stdout);
    while (argc > 1 && access(argv[1], F_OK) != 0)
        usleep(20000);
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    for (int i = 0; i < 10; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        usleep(20000);
    }
    printf("OK %d\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
