/* The MPI part of loader.c: initialises MPI, says INIT and waits for
 * DIR/init-go (the test writes it once the daemon has attached), then makes
 * BARRIERS barriers. */
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>

#define BARRIERS 7

int plugin_run(const char *dir) {
    char path[4096];
    MPI_Init(NULL, NULL);
    printf("INIT\n");
    fflush(stdout);
    snprintf(path, sizeof path, "%s/init-go", dir);
    for (int i = 0; access(path, F_OK) != 0; i++) {
        if (i == 6000) /* 60 s: a failed test leaves nothing running */
            return 7;
        usleep(10000);
    }
    for (int i = 0; i < BARRIERS; i++)
        MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    printf("OK\n");
    fflush(stdout);
    return 0;
}
