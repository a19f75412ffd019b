/* A stand-in MPI library whose ABI the stats layer cannot know: it is
 * neither Open MPI, MPICH, Intel MPI nor the MPI-5 standard ABI. It
 * implements the few procedures fakeapp.c calls, each MPI_X as a weak alias
 * of PMPI_X as real libraries do, and counts the sends it received. */
static int sends;

int PMPI_Init(int *argc, char ***argv) { (void)argc; (void)argv; return 0; }
int PMPI_Finalize(void) { return 0; }
int PMPI_Comm_size(long comm, int *size) { (void)comm; *size = 1; return 0; }
int PMPI_Comm_rank(long comm, int *rank) { (void)comm; *rank = 0; return 0; }
int PMPI_Send(const void *buf, int count, long type, int dest, int tag, long comm) {
    (void)buf; (void)count; (void)type; (void)dest; (void)tag; (void)comm;
    sends++;
    return 0;
}
int fake_sends(void) { return sends; }

int MPI_Init(int *, char ***) __attribute__((weak, alias("PMPI_Init")));
int MPI_Finalize(void) __attribute__((weak, alias("PMPI_Finalize")));
int MPI_Comm_size(long, int *) __attribute__((weak, alias("PMPI_Comm_size")));
int MPI_Comm_rank(long, int *) __attribute__((weak, alias("PMPI_Comm_rank")));
int MPI_Send(const void *, int, long, int, int, long) __attribute__((weak, alias("PMPI_Send")));
