/* Full traffic with every payload checked, until a stop file exists: the
 * job tests/tests/inject.rs kills injecting daemons around.
 *
 * usage: kill9 GOFILE
 * Every rank prints "READY <rank> <pid>" and waits for GOFILE; then rounds
 * of an Isend/Irecv ring, an MPI_Sendrecv ring and an MPI_Allreduce, all
 * checked, until GOFILE.stop exists (rank 0 looks every 64 rounds and
 * broadcasts the decision); then "OK <rank> <rounds>". */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void fail(const char *what, int rank, long it) {
    fprintf(stderr, "WRONG %s rank %d round %ld\n", what, rank, it);
    MPI_Abort(MPI_COMM_WORLD, 3);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *go = argc > 1 ? argv[1] : "go";
    char stop[4096];
    snprintf(stop, sizeof stop, "%s.stop", go);
    printf("READY %d %d\n", rank, (int)getpid());
    fflush(stdout);
    while (access(go, F_OK) != 0)
        usleep(20000);
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    long it = 0;
    for (;; it++) {
        if (it % 64 == 0) {
            int done = rank == 0 && access(stop, F_OK) == 0;
            MPI_Bcast(&done, 1, MPI_INT, 0, MPI_COMM_WORLD);
            if (done) break;
        }
        long s[4], r[4];
        for (int i = 0; i < 4; i++) s[i] = rank * 1000000007L + it * 4 + i;
        MPI_Request q[2];
        MPI_Irecv(r, 4, MPI_LONG, left, 1, MPI_COMM_WORLD, &q[0]);
        MPI_Isend(s, 4, MPI_LONG, right, 1, MPI_COMM_WORLD, &q[1]);
        MPI_Waitall(2, q, MPI_STATUSES_IGNORE);
        for (int i = 0; i < 4; i++)
            if (r[i] != left * 1000000007L + it * 4 + i) fail("ring", rank, it);
        double d = rank + it, e = -1;
        MPI_Sendrecv(&d, 1, MPI_DOUBLE, right, 2, &e, 1, MPI_DOUBLE, left, 2, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        if (e != left + it) fail("sendrecv", rank, it);
        long one = it, total = 0;
        MPI_Allreduce(&one, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        if (total != it * size) fail("allreduce", rank, it);
    }
    printf("OK %d %ld\n", rank, it);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
