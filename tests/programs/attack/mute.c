/* Holds argv[2] connections to the daemon's exit-handover socket (argv[1])
 * open and mute for argv[3] milliseconds: it connects and never says a
 * word; whenever the daemon closes one, it connects again at once. Then it
 * prints "connects N". A daemon that waited on any one connection would
 * push other users' knocks past the shim's patience. Not an MPI program. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static struct sockaddr_un sa = {.sun_family = AF_UNIX};

static int mute(void) {
    for (;;) {
        int s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
        if (s < 0) {
            perror("mute: socket");
            exit(1);
        }
        if (connect(s, (struct sockaddr *)&sa, sizeof sa) == 0)
            return s;
        int e = errno;
        close(s);
        if (e != EAGAIN) {
            fprintf(stderr, "mute: connect: %s\n", strerror(e));
            exit(1);
        }
        usleep(1000); /* a full backlog: the daemon catches up */
    }
}

static long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: mute SOCKET CONNECTIONS MS\n");
        return 2;
    }
    strncpy(sa.sun_path, argv[1], sizeof sa.sun_path - 1);
    int n = atoi(argv[2]);
    long end = now_ms() + atol(argv[3]), connects = 0;
    struct pollfd *p = calloc((size_t)n, sizeof *p);
    for (int i = 0; i < n; i++) {
        p[i].fd = mute();
        p[i].events = POLLIN;
        connects++;
    }
    while (now_ms() < end) {
        if (poll(p, (nfds_t)n, 50) < 0 && errno != EINTR) {
            perror("mute: poll");
            return 1;
        }
        for (int i = 0; i < n; i++) {
            if (p[i].revents == 0)
                continue;
            /* Closed (or answered, which a mute connection never is). */
            close(p[i].fd);
            p[i].fd = mute();
            p[i].revents = 0;
            connects++;
        }
    }
    printf("connects %ld\n", connects);
    return 0;
}
