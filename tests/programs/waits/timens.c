/* The nodes' clocks of tests/tests/e2e/waits_nodes.rs: Linux time
 * namespaces (CLONE_NEWTIME, 5.6+) whose CLOCK_MONOTONIC is offset by a
 * number of nanoseconds, which util-linux's `unshare --monotonic` (whole
 * seconds) cannot give.
 *
 * usage: timens hold OFFSET_NS
 *   unshare(CLONE_NEWTIME) and write "monotonic S NS" to
 *   /proc/self/timens_offsets: the new namespace is this process's
 *   children's (it stays in its own), and its offsets can be written only
 *   before any process enters it. Then sleeps until killed, holding the
 *   namespace: others enter it with
 *   `nsenter --time=/proc/PID/ns/time_for_children`.
 * usage: timens now
 *   prints CLOCK_MONOTONIC minus CLOCK_REALTIME, in ns: a time namespace
 *   offsets the first and never the second, so the difference between
 *   two namespaces' prints is their offset (to the NTP slew in between). */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif

static long long ns(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "now")) {
        /* The realtime read between two monotonic ones. */
        long long a = ns(CLOCK_MONOTONIC), r = ns(CLOCK_REALTIME), b = ns(CLOCK_MONOTONIC);
        printf("%lld\n", a + (b - a) / 2 - r);
        return 0;
    }
    if (argc != 3 || strcmp(argv[1], "hold")) {
        fprintf(stderr, "usage: timens hold OFFSET_NS | timens now\n");
        return 2;
    }
    long long off = atoll(argv[2]);
    /* The kernel wants 0 <= nsecs < 1e9: -5 ms is "-1 995000000". */
    long long secs = off / 1000000000LL, nsecs = off % 1000000000LL;
    if (nsecs < 0) {
        secs -= 1;
        nsecs += 1000000000LL;
    }
    if (unshare(CLONE_NEWTIME) != 0) {
        fprintf(stderr, "timens: unshare(CLONE_NEWTIME): %s\n", strerror(errno));
        return 1;
    }
    FILE *f = fopen("/proc/self/timens_offsets", "w");
    if (!f) {
        fprintf(stderr, "timens: /proc/self/timens_offsets: %s\n", strerror(errno));
        return 1;
    }
    fprintf(f, "monotonic %lld %lld\n", secs, nsecs);
    if (fclose(f) != 0) {
        fprintf(stderr, "timens: writing the offsets: %s\n", strerror(errno));
        return 1;
    }
    for (;;) pause();
}
