/* Runs against fakempi.c's library: three sends, then prints how many the
 * library received. */
#include <stdio.h>

int MPI_Init(int *argc, char ***argv);
int MPI_Finalize(void);
int MPI_Send(const void *buf, int count, long type, int dest, int tag, long comm);
int fake_sends(void);

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int x = 42;
    for (int i = 0; i < 3; i++)
        MPI_Send(&x, 1, 7, 0, i, 1);
    MPI_Finalize();
    printf("fake sends=%d\n", fake_sends());
    return 0;
}
