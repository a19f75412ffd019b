/* insns: which first instructions x86-64 uprobes emulate, measured.
 *
 *   insns GO_FILE BATCHES CALLS
 *
 * Each f_* function starts with one instruction of a class found at the
 * start of PMPI functions (see `mpi-observer sites`), then undoes it and
 * returns. After printing "ready pid=N" the program waits for GO_FILE, then
 * calls every function CALLS times per batch, round-robin, and prints
 * "f_x=NS", the median over batches of the thread's CPU ns per call
 * (user + system, so a probe's trap counts but time descheduled does not),
 * and "done". The bench times this with
 * and without an entry uprobe on every f_*: the added cost tells emulated
 * (cheap) from single-stepped (dear) without needing an MPI call that is
 * cheap to make. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define FN(name, body) \
    __asm__(".text\n.globl " #name "\n.type " #name ",@function\n" #name ":\n" body "\n.size " #name ",.-" #name "\n"); \
    void name(void);

FN(f_push_rbp, "push %rbp\n pop %rbp\n ret")                 /* 55 */
FN(f_push_r15, "push %r15\n pop %r15\n ret")                 /* 41 57 */
FN(f_sub_rsp, "sub $0x28,%rsp\n add $0x28,%rsp\n ret")       /* 48 83 ec 28 */
FN(f_cmp_imm32, "cmp $0x7fffffff,%rdx\n ret")               /* 48 81 fa ff ff ff 7f */
FN(f_mov_rr, "mov %rdx,%rcx\n ret")                         /* 48 89 d1 */
FN(f_mov_rip, "mov f_data(%rip),%rax\n ret")                /* 48 8b 05 */
FN(f_lea_rip, "lea f_data(%rip),%rax\n ret")                /* 48 8d 05 */
FN(f_endbr64, "endbr64\n ret")                              /* f3 0f 1e fa */
FN(f_nop, "nop\n ret")                                      /* 90 */
FN(f_nopl, ".byte 0x0f,0x1f,0x40,0x00\n ret")               /* 0f 1f 40 00 */
FN(f_jmp8, ".byte 0xeb,0x00\n ret")                         /* eb 00 */
FN(f_jmp32, ".byte 0xe9,0,0,0,0\n ret")                     /* e9 00 00 00 00 */
FN(f_call, ".byte 0xe8,0,0,0,0\n add $8,%rsp\n ret")       /* e8 00 00 00 00 */
FN(f_jcc, ".byte 0x75,0x00\n ret")                          /* 75 00: jne */
__asm__(".data\nf_data: .quad 0\n.text\n");

struct f {
    const char *name;
    void (*fn)(void);
};

static const struct f fns[] = {
    {"f_push_rbp", f_push_rbp}, {"f_push_r15", f_push_r15}, {"f_sub_rsp", f_sub_rsp},
    {"f_cmp_imm32", f_cmp_imm32}, {"f_mov_rr", f_mov_rr},   {"f_mov_rip", f_mov_rip},
    {"f_lea_rip", f_lea_rip},   {"f_endbr64", f_endbr64},   {"f_nop", f_nop},
    {"f_nopl", f_nopl},         {"f_jmp8", f_jmp8},         {"f_jmp32", f_jmp32},
    {"f_call", f_call},         {"f_jcc", f_jcc},
};
#define NF (int)(sizeof fns / sizeof fns[0])

static double cpu_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: insns GO_FILE BATCHES CALLS\n");
        return 2;
    }
    int batches = atoi(argv[2]);
    long calls = atol(argv[3]);
    printf("ready pid=%d\n", (int)getpid());
    fflush(stdout);
    while (access(argv[1], F_OK) != 0)
        usleep(2000);
    double *ns = malloc(sizeof(double) * NF * batches);
    for (int b = 0; b < batches; b++)
        for (int k = 0; k < NF; k++) {
            void (*volatile fn)(void) = fns[k].fn;
            double t0 = cpu_ns();
            for (long i = 0; i < calls; i++)
                fn();
            ns[k * batches + b] = (cpu_ns() - t0) / calls;
        }
    for (int k = 0; k < NF; k++) {
        qsort(ns + k * batches, batches, sizeof(double), cmp);
        printf("%s=%.1f\n", fns[k].name, ns[k * batches + batches / 2]);
    }
    printf("done\n");
    fflush(stdout);
    free(ns);
    return 0;
}
