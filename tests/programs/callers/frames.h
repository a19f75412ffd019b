/* Shared by the caller-fidelity tools (who.c, walk.c): where a code address
 * lies, as "OFFSET<TAB>OBJECT" with the offset relative to the object's load
 * bias (what addr2line -e OBJECT takes) and the object's real path. Every
 * helper is static: each tool is its own level, and must not bind another
 * tool's copy. */
#ifndef CALLERS_FRAMES_H
#define CALLERS_FRAMES_H

#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Room for the calls of one rank: the apps make a few dozen. */
#define MAX_CALLS 4096

/* Writes where `a` lies to `f`; "-\t-" when no loaded object holds it. */
static void put_frame(FILE *f, const void *a) {
    Dl_info info;
    struct link_map *lm = NULL;
    if (a == NULL || dladdr1(a, &info, (void **)&lm, RTLD_DL_LINKMAP) == 0 || lm == NULL) {
        fputs("-\t-", f);
        return;
    }
    /* The main program's link map has an empty name: /proc/self/exe names it. */
    const char *name = lm->l_name[0] != '\0' ? lm->l_name : "/proc/self/exe";
    char path[PATH_MAX];
    if (realpath(name, path) == NULL)
        snprintf(path, sizeof path, "%s", name);
    fprintf(f, "%lx\t%s", (unsigned long)((uintptr_t)a - lm->l_addr), path);
}

/* Opens "$VAR.<pid>" for writing, or returns NULL when VAR is unset. */
static FILE *open_out(const char *var) {
    const char *prefix = getenv(var);
    if (prefix == NULL || prefix[0] == '\0')
        return NULL;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s.%d", prefix, (int)getpid());
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        perror(path);
        abort();
    }
    return f;
}

#endif
