/* Knocks at the daemon's exit-handover socket (argv[1]) argv[2] times, as
 * a shim rank does once at its exit, one knock after the other, and says
 * how each ended: "answered" (the daemon's byte), "closed" (closed
 * unanswered) or "timeout" (no word within 2 s). Not an MPI program: the
 * daemon must find that out at most once. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: knock SOCKET COUNT\n");
        return 2;
    }
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    strncpy(sa.sun_path, argv[1], sizeof sa.sun_path - 1);
    int n = atoi(argv[2]), answered = 0, closed = 0, timeout = 0;
    for (int i = 0; i < n; i++) {
        int s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
        if (s < 0 || connect(s, (struct sockaddr *)&sa, sizeof sa) != 0) {
            perror("knock: connect");
            return 1;
        }
        if (send(s, "MPIOHO01", 8, MSG_NOSIGNAL) != 8) {
            perror("knock: send");
            return 1;
        }
        struct pollfd p = {.fd = s, .events = POLLIN};
        char b;
        if (poll(&p, 1, 2000) <= 0)
            timeout++;
        else if (recv(s, &b, 1, MSG_DONTWAIT) == 1)
            answered++;
        else
            closed++;
        close(s);
    }
    printf("answered %d closed %d timeout %d\n", answered, closed, timeout);
    return 0;
}
