/* A rank caught while the dynamic loader maps its MPI library: the library
 * file is mapped read-only, its code not yet (the loader's first step),
 * and held so until the file DIR/mapped-go exists. Then the plugin that
 * links MPI is loaded, as a real load maps it.
 *
 * loader PLUGIN LIBMPI DIR */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Gives up after 60 s, so a failed test leaves nothing running. */
static void wait_for(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    for (int i = 0; access(path, F_OK) != 0; i++) {
        if (i == 6000)
            exit(7);
        usleep(10000);
    }
}

int main(int argc, char **argv) {
    if (argc < 4)
        return 2;
    int fd = open(argv[2], O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0)
        return 3;
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED)
        return 4;
    printf("MAPPED\n");
    fflush(stdout);
    wait_for(argv[3], "mapped-go");
    munmap(p, (size_t)st.st_size);
    close(fd);
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 5;
    }
    int (*run)(const char *) = (int (*)(const char *))dlsym(h, "plugin_run");
    if (!run)
        return 6;
    return run(argv[3]);
}
