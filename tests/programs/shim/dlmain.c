/* Loads the plugin named by argv[1] as Python loads a module (RTLD_NOW,
 * RTLD_LOCAL), finds its entry point with dlsym and runs it. */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
    if (argc < 2)
        return 2;
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    int (*run)(void) = (int (*)(void))dlsym(h, "plugin_run");
    if (!run) {
        fprintf(stderr, "dlsym: %s\n", dlerror());
        return 1;
    }
    return run();
}
