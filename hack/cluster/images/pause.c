/*
 * The sandbox ("pause") program of the test cluster's pods: PID 1 of each pod
 * sandbox. It blocks until SIGINT or SIGTERM and reaps every child handed to
 * it. Built statically by hack/cluster/images.sh: no registry is reachable, so
 * the cluster cannot pull one.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_stop(int sig) { (void)sig; stop = 1; }

static void on_child(int sig) {
    (void)sig;
    int saved = errno;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = saved;
}

int main(int argc, char **argv) {
    if (argc > 1 && argv[1][0] == '-' && argv[1][1] == 'v') {
        puts("gpu-dra-pause 1");
        return 0;
    }
    if (getpid() != 1) {
        fprintf(stderr, "warning: not PID 1, children of others are not reaped here\n");
    }
    struct sigaction act = {0};
    act.sa_handler = on_stop;
    sigaction(SIGINT, &act, NULL);
    sigaction(SIGTERM, &act, NULL);
    act.sa_handler = on_child;
    act.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    sigaction(SIGCHLD, &act, NULL);
    while (!stop) {
        pause();
    }
    return 0;
}
