/* A fake MPI process for the attack tests (tests/src/attack.rs).
 *
 * usage: fake map  LIB [N]
 *        fake call LIB [N [SITES]]
 *
 * It maps LIB, a file whose name starts with "libmpi.so", so `attach --all`
 * takes it for an MPI rank, then forks until there are N such processes
 * (default 1). Each prints "READY <pid>" and then:
 *   map:  sleeps (pause) with LIB mapped read+exec from offset 0, as ld.so
 *         maps a library's first segment; it never calls into it, so LIB
 *         may be swapped or truncated afterwards without harm to the fake.
 *   call: LIB was dlopen()ed (stubmpi.c built as libmpi.so.40: a real
 *         libmpi aborts when called before MPI_Init), and it calls
 *         MPI_Barrier and MPI_Send (zero handles, which the stub ignores)
 *         from SITES distinct call sites (default 1, at most 1024), one
 *         round every millisecond, forever.
 *
 * Built with -O0 so the compiler keeps the SITES call instructions apart. */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef int (*barrier_fn)(long);
typedef int (*send_fn)(const void *, int, long, int, int, long);

static barrier_fn barrier;
static send_fn send;

/* One call site per case: site n calls MPI_Barrier when n is even and
 * MPI_Send when odd, so both functions get many sites. */
#define SITE(n)                                   \
    case (n):                                     \
        if ((n) % 2 == 0) {                       \
            barrier(0);                           \
        } else {                                  \
            send(NULL, 0, 0, 0, 0, 0);            \
        }                                         \
        break;
#define R4(b) SITE(b) SITE((b) + 1) SITE((b) + 2) SITE((b) + 3)
#define R16(b) R4(b) R4((b) + 4) R4((b) + 8) R4((b) + 12)
#define R64(b) R16(b) R16((b) + 16) R16((b) + 32) R16((b) + 48)
#define R256(b) R64(b) R64((b) + 64) R64((b) + 128) R64((b) + 192)
#define MAX_SITES 1024

static void call_site(int n) {
    switch (n) {
        R256(0) R256(256) R256(512) R256(768)
    }
}

static void die(const char *what, const char *lib) {
    fprintf(stderr, "fake: %s %s: ", what, lib);
    perror(NULL);
    exit(2);
}

int main(int argc, char **argv) {
    if (argc < 3 || (strcmp(argv[1], "map") && strcmp(argv[1], "call"))) {
        fprintf(stderr, "usage: fake map|call LIB [N [SITES]]\n");
        return 2;
    }
    const char *lib = argv[2];
    int n = argc > 3 ? atoi(argv[3]) : 1;
    int sites = argc > 4 ? atoi(argv[4]) : 1;
    if (sites < 1 || sites > MAX_SITES) {
        fprintf(stderr, "fake: SITES must be 1..%d\n", MAX_SITES);
        return 2;
    }
    int call = strcmp(argv[1], "call") == 0;
    if (call) {
        void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            fprintf(stderr, "fake: dlopen %s: %s\n", lib, dlerror());
            return 2;
        }
        barrier = (barrier_fn)dlsym(h, "MPI_Barrier");
        send = (send_fn)dlsym(h, "MPI_Send");
        if (!barrier || !send) {
            fprintf(stderr, "fake: %s lacks MPI_Barrier or MPI_Send\n", lib);
            return 2;
        }
    } else {
        int fd = open(lib, O_RDONLY);
        if (fd < 0) die("open", lib);
        struct stat st;
        if (fstat(fd, &st) != 0) die("fstat", lib);
        if (mmap(NULL, st.st_size, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0) == MAP_FAILED)
            die("mmap", lib);
        close(fd);
    }
    /* Fork after mapping: the copies share the mapping's pages. */
    for (int i = 1; i < n; i++) {
        pid_t p = fork();
        if (p < 0) die("fork for", lib);
        if (p == 0) break;
    }
    printf("READY %d\n", (int)getpid());
    fflush(stdout);
    if (!call)
        for (;;) pause();
    for (;;) {
        for (int s = 0; s < sites; s++) call_site(s);
        usleep(1000);
    }
}
