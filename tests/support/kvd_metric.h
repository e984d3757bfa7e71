/*
 * Reads one value from a kvdepotd's /metrics, for the tests and the
 * benchmarks that start daemons: the port comes from the daemon's ready
 * file (--ready-file, "metrics_port=N"), the daemon having been started
 * with server.metrics_address=127.0.0.1:0. Header-only, no test framework.
 */
#ifndef KVD_TESTS_SUPPORT_METRIC_H
#define KVD_TESTS_SUPPORT_METRIC_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The metrics port a daemon wrote in its ready file, or 0. */
static inline int kvd_metric_port(const char *ready_path)
{
    char line[128];
    FILE *f = fopen(ready_path, "re");
    int port = 0;
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        (void)sscanf(line, "metrics_port=%d", &port);
    }
    if (f != NULL) {
        fclose(f);
    }
    return port;
}

/* The value of metric `name` (a line "name value"), or -1 when it cannot
 * be read. */
static inline double kvd_metric_read(const char *ready_path, const char *name)
{
    int port = kvd_metric_port(ready_path);
    int fd = port > 0 ? socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0) : -1;
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    static const char rq[] = "GET /metrics HTTP/1.0\r\n\r\n";
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap + 1);
    ssize_t n = buf != NULL ? write(fd, rq, sizeof rq - 1) : -1;
    while (n > 0 && len < cap && (n = read(fd, buf + len, cap - len)) > 0) {
        len += (size_t)n;
    }
    close(fd);
    double v = -1;
    if (buf != NULL) {
        buf[len] = '\0';
        size_t nl = strlen(name);
        for (char *p = buf; p != NULL && *p != '\0';) {
            if (strncmp(p, name, nl) == 0 && p[nl] == ' ') {
                v = strtod(p + nl + 1, NULL);
                break;
            }
            p = strchr(p, '\n');
            p = p != NULL ? p + 1 : NULL;
        }
    }
    free(buf);
    return v;
}

#endif /* KVD_TESTS_SUPPORT_METRIC_H */
