/* A stand-in libmpi for the attack tests' calling fakes (fake.c, "call"
 * mode): a real libmpi aborts when called before MPI_Init, this one just
 * returns. Built as libmpi.so.40 so `attach --all` probes it; the daemon
 * reads it as MPICH (integer handles), or as Open MPI when built with
 * -DAS_OPEN_MPI (it then exports ompi_mpi_comm_world, Open MPI's mark).
 * Each MPI_X is a weak alias of PMPI_X, as in real libraries. */
#ifdef AS_OPEN_MPI
char ompi_mpi_comm_world[512];
#endif

int PMPI_Barrier(long comm) { (void)comm; return 0; }
int PMPI_Send(const void *buf, int count, long type, int dest, int tag, long comm) {
    (void)buf; (void)count; (void)type; (void)dest; (void)tag; (void)comm;
    return 0;
}

int MPI_Barrier(long) __attribute__((weak, alias("PMPI_Barrier")));
int MPI_Send(const void *, int, long, int, int, long) __attribute__((weak, alias("PMPI_Send")));
