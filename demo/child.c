/*
 * One request in a new process (demo/engine_int.h, kvd_demo_run_child):
 * each scenario of the demos starts from nothing, as a restarted engine
 * does; the outcome comes back through a pipe.
 */
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "demo/engine_int.h"

int kvd_demo_run_child(const kvd_demo_opts_t *o, kvd_demo_outcome_t *out)
{
    int fds[2];
    if (pipe(fds) != 0) {
        perror("pipe");
        return -1;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        close(fds[0]);
        static kvd_demo_outcome_t oc; /* large: not on the stack */
        memset(&oc, 0, sizeof oc);
        oc.status = kvd_demo_run(o, &oc.r, oc.err, sizeof oc.err);
        size_t put = 0;
        while (put < sizeof oc) {
            ssize_t w = write(fds[1], (const char *)&oc + put, sizeof oc - put);
            if (w <= 0) {
                _exit(1);
            }
            put += (size_t)w;
        }
        _exit(0);
    }
    close(fds[1]);
    size_t got = 0;
    while (got < sizeof *out) {
        ssize_t n = read(fds[0], (char *)out + got, sizeof *out - got);
        if (n <= 0) {
            break;
        }
        got += (size_t)n;
    }
    close(fds[0]);
    int wst = 0;
    waitpid(pid, &wst, 0);
    if (got != sizeof *out || !WIFEXITED(wst) || WEXITSTATUS(wst) != 0) {
        fprintf(stderr, "kvdepot-demo: a scenario process died\n");
        return -1;
    }
    if (out->status != KVD_OK) {
        fprintf(stderr, "kvdepot-demo: %s: %s\n", kvd_status_str(out->status),
                out->err);
        return -1;
    }
    return 0;
}
