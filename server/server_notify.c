/*
 * systemd's service notifications (sd_notify(3)) for kvdepotd, so a
 * Type=notify unit is "active" only once the daemon serves: STATUS= lines
 * while the start does its long steps (the arena is touched, the index
 * opened), READY=1 when every listener is up, STOPPING=1 as a stop begins,
 * WATCHDOG=1 while the service's housekeeping thread keeps its pace.
 *
 * libsystemd is optional (pkg-config, KVD_HAVE_LIBSYSTEMD): without it
 * every call here does nothing and the watchdog is off, and the unit file
 * says to use Type=exec. Without $NOTIFY_SOCKET (not started by systemd)
 * sd_notify does nothing either, so tests and shells see no difference.
 */
#include <stdarg.h>
#include <stdio.h>

#ifdef KVD_HAVE_LIBSYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include "common/log_int.h"
#include "server/server_int.h"

void kvd_server_notify(const char *state)
{
#ifdef KVD_HAVE_LIBSYSTEMD
    int rc = sd_notify(0, state);
    if (rc < 0) {
        KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 10000,
                            "kvdepotd: sd_notify(%s): error %d", state, rc);
    }
#else
    (void)state;
#endif
}

void kvd_server_notify_status(const char *fmt, ...)
{
    char line[512] = "STATUS=";
    va_list ap;
    va_start(ap, fmt);
    (void)vsnprintf(line + 7, sizeof line - 7, fmt, ap);
    va_end(ap);
    kvd_server_notify(line);
}

uint64_t kvd_server_watchdog_usec(void)
{
#ifdef KVD_HAVE_LIBSYSTEMD
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) > 0) {
        return usec;
    }
#endif
    return 0;
}
