/*
 * The recording half of the power-loss model (tests/support/kvd_powercut.h):
 * an LD_PRELOAD library that interposes the libc calls a store uses to
 * write and sync its files (open, pwrite, pwritev, write, writev,
 * ftruncate, fallocate, fsync, fdatasync, close) and, for the files
 * directly inside $KVD_POWERCUT_DIR, keeps in $KVD_POWERCUT_SHADOW the
 * last durable image of each file and a log of the writes made since. The
 * test then kills the process and rewrites every file as a power loss
 * could have left it.
 *
 * It sees only calls that go through libc's dynamic symbols: io_uring
 * submissions and writes through a shared mapping bypass it, so a store
 * under the model runs with store.disk_engine=threads (pread/pwrite) and an
 * index without MDB_WRITEMAP (LMDB's pwrite/writev + fdatasync).
 *
 * Every recorded call runs under one process-wide mutex, the real call
 * first and its log record after, so a kill between the two loses a write
 * that was never durable (a valid outcome) and never invents one. Directory
 * fsync (an fd opened on $KVD_POWERCUT_DIR) makes the names of the files
 * created before it durable. For tests only; not part of libkvdepot.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <sys/uio.h>

#include "tests/support/kvd_powercut.h"

#define PC_FDS 1024
/* The build hides symbols by default; these must interpose libc's. */
#define PC_API __attribute__((visibility("default")))

typedef struct pc_fd {
    char name[128]; /* file name inside the watched directory */
    bool used, dsync, is_dir;
} pc_fd_t;

static pthread_mutex_t pc_mu = PTHREAD_MUTEX_INITIALIZER;
static pc_fd_t pc_fds[PC_FDS];
/* Set while this thread is inside the model, whose own file calls must not
 * be recorded (nor take pc_mu again). */
static __thread bool pc_busy;

#define REAL(ret, fn, ...)                                                     \
    static ret (*real_##fn)(__VA_ARGS__);                                      \
    if (real_##fn == NULL) {                                                   \
        real_##fn = (ret(*)(__VA_ARGS__))dlsym(RTLD_NEXT, #fn);                \
    }

/* The watched name of `path` (a file directly in the directory, not the
 * LMDB lock file), "" for the directory itself, NULL otherwise. */
static const char *pc_watched(const char *path)
{
    const char *dir = getenv("KVD_POWERCUT_DIR");
    size_t n = dir != NULL ? strlen(dir) : 0;
    if (n == 0 || getenv("KVD_POWERCUT_SHADOW") == NULL || path == NULL ||
        strncmp(path, dir, n) != 0) {
        return NULL;
    }
    if (path[n] == '\0') {
        return "";
    }
    const char *name = path + n + 1;
    size_t len = strlen(name);
    if (path[n] == '/' && (len == 0 || strcmp(name, ".") == 0)) {
        return "";
    }
    if (strcmp(name, "..") == 0) {
        return NULL;
    }
    if (path[n] != '/' || strchr(name, '/') != NULL || len == 0 ||
        len >= sizeof pc_fds[0].name ||
        (len > 5 && strcmp(name + len - 5, "-lock") == 0)) {
        return NULL;
    }
    return name;
}

static void pc_shadow_path(char *buf, size_t cap, const char *name,
                           const char *ext)
{
    snprintf(buf, cap, "%s/%s%s", getenv("KVD_POWERCUT_SHADOW"), name, ext);
}

static void pc_log(const pc_fd_t *f, uint32_t kind, uint64_t off, uint64_t len,
                   const void *data)
{
    char p[1024];
    pc_shadow_path(p, sizeof p, f->name, ".log");
    int lfd = open(p, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (lfd < 0) {
        abort(); /* the model must not silently miss a write */
    }
    kvd_powercut_rec_t r = {KVD_POWERCUT_MAGIC, kind, off, len};
    struct iovec v[2] = {{&r, sizeof r}, {(void *)data, data ? len : 0}};
    if (writev(lfd, v, 2) != (ssize_t)(sizeof r + (data ? len : 0))) {
        abort();
    }
    close(lfd);
}

/* Applies the log to the image in place (the file is durable now). */
static void pc_sync(const pc_fd_t *f)
{
    char img[1024], log[1024];
    pc_shadow_path(img, sizeof img, f->name, ".img");
    pc_shadow_path(log, sizeof log, f->name, ".log");
    uint8_t *lg;
    size_t lg_len;
    int ifd = open(img, O_RDWR | O_CLOEXEC);
    if (ifd < 0 || kvd_powercut_slurp(log, &lg, &lg_len) != 0) {
        abort();
    }
    for (size_t at = 0; at + sizeof(kvd_powercut_rec_t) <= lg_len;) {
        kvd_powercut_rec_t r;
        memcpy(&r, lg + at, sizeof r);
        at += sizeof r;
        struct stat sb;
        int rc = 0;
        if (r.kind == KVD_POWERCUT_WRITE) {
            rc = pwrite(ifd, lg + at, (size_t)r.len, (off_t)r.off) ==
                         (ssize_t)r.len
                     ? 0
                     : -1;
            at += (size_t)r.len;
        } else if (r.kind == KVD_POWERCUT_SIZE) {
            rc = ftruncate(ifd, (off_t)r.off);
        } else if (fstat(ifd, &sb) == 0 &&
                   (uint64_t)sb.st_size < r.off + r.len) {
            rc = ftruncate(ifd, (off_t)(r.off + r.len));
        }
        if (rc != 0) {
            abort();
        }
    }
    close(ifd);
    (void)unlink(log);
    free(lg);
}

/* Dir fsync: every name created so far is durable. */
static void pc_sync_dir(void)
{
    const char *shadow = getenv("KVD_POWERCUT_SHADOW");
    DIR *d = shadow != NULL ? opendir(shadow) : NULL;
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (n > 4 && strcmp(e->d_name + n - 4, ".new") == 0) {
            char p[1024];
            pc_shadow_path(p, sizeof p, e->d_name, "");
            (void)unlink(p);
        }
    }
    if (d != NULL) {
        closedir(d);
    }
}

/* Called with pc_mu held after the real open returned fd. */
static void pc_track(int fd, const char *name, int flags, bool existed)
{
    if (fd < 0 || fd >= PC_FDS) {
        return;
    }
    pc_fd_t *f = &pc_fds[fd];
    memset(f, 0, sizeof *f);
    f->used = true;
    f->is_dir = name[0] == '\0';
    f->dsync = (flags & (O_DSYNC | O_SYNC)) != 0;
    snprintf(f->name, sizeof f->name, "%s", name);
    if (f->is_dir) {
        return;
    }
    char img[1024];
    pc_shadow_path(img, sizeof img, name, ".img");
    if (access(img, F_OK) == 0) {
        return;
    }
    /* First sight of this file: what is there now is durable (the last cut
     * left it), or it is new and its name is not durable yet. */
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", getenv("KVD_POWERCUT_DIR"), name);
    uint8_t *buf;
    size_t len;
    if (kvd_powercut_slurp(existed ? path : "/nonexistent/", &buf, &len) != 0 ||
        kvd_powercut_spill(img, buf, len) != 0) {
        abort();
    }
    free(buf);
    if (!existed) {
        pc_shadow_path(img, sizeof img, name, ".new");
        if (kvd_powercut_spill(img, (const uint8_t *)"", 0) != 0) {
            abort();
        }
    }
}

static int pc_open(int dirfd, const char *path, int flags, mode_t mode)
{
    REAL(int, openat, int, const char *, int, ...);
    const char *name = dirfd == AT_FDCWD && !pc_busy ? pc_watched(path) : NULL;
    if (name == NULL) {
        return real_openat(dirfd, path, flags, mode);
    }
    pthread_mutex_lock(&pc_mu);
    pc_busy = true;
    bool existed = access(path, F_OK) == 0;
    int fd = real_openat(dirfd, path, flags, mode);
    int e = errno;
    pc_track(fd, name, flags, existed);
    pc_busy = false;
    pthread_mutex_unlock(&pc_mu);
    errno = e;
    return fd;
}

static mode_t pc_mode(int flags, va_list ap)
{
    return (flags & (O_CREAT | O_TMPFILE)) != 0 ? (mode_t)va_arg(ap, int) : 0;
}

PC_API int open(const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t m = pc_mode(flags, ap);
    va_end(ap);
    return pc_open(AT_FDCWD, path, flags, m);
}

PC_API int open64(const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t m = pc_mode(flags, ap);
    va_end(ap);
    return pc_open(AT_FDCWD, path, flags, m);
}

PC_API int openat(int dirfd, const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t m = pc_mode(flags, ap);
    va_end(ap);
    return pc_open(dirfd, path, flags, m);
}

PC_API int close(int fd)
{
    REAL(int, close, int);
    if (fd >= 0 && fd < PC_FDS && pc_fds[fd].used && !pc_busy) {
        pthread_mutex_lock(&pc_mu);
        pc_fds[fd].used = false;
        int rc = real_close(fd);
        pthread_mutex_unlock(&pc_mu);
        return rc;
    }
    return real_close(fd);
}

static pc_fd_t *pc_get(int fd)
{
    return fd >= 0 && fd < PC_FDS && pc_fds[fd].used && !pc_fds[fd].is_dir &&
                   !pc_busy
               ? &pc_fds[fd]
               : NULL;
}

/* Records `n` bytes written at `off` from the iovecs; with pc_mu held. */
static void pc_wrote(pc_fd_t *f, const struct iovec *iov, int cnt, off_t off,
                     ssize_t n)
{
    for (int i = 0; i < cnt && n > 0; i++) {
        size_t len = iov[i].iov_len < (size_t)n ? iov[i].iov_len : (size_t)n;
        pc_log(f, KVD_POWERCUT_WRITE, (uint64_t)off, len, iov[i].iov_base);
        off += (off_t)len;
        n -= (ssize_t)len;
    }
    if (f->dsync) {
        pc_sync(f);
    }
}

static ssize_t pc_pwritev(int fd, const struct iovec *iov, int cnt, off_t off,
                          bool positioned)
{
    REAL(ssize_t, pwritev, int, const struct iovec *, int, off_t);
    REAL(ssize_t, writev, int, const struct iovec *, int);
    pc_fd_t *f = pc_get(fd);
    if (f == NULL) {
        return positioned ? real_pwritev(fd, iov, cnt, off)
                          : real_writev(fd, iov, cnt);
    }
    pthread_mutex_lock(&pc_mu);
    pc_busy = true;
    if (!positioned) {
        off = lseek(fd, 0, SEEK_CUR);
    }
    ssize_t n = positioned ? real_pwritev(fd, iov, cnt, off)
                           : real_writev(fd, iov, cnt);
    int e = errno;
    if (n > 0) {
        pc_wrote(f, iov, cnt, off, n);
    }
    pc_busy = false;
    pthread_mutex_unlock(&pc_mu);
    errno = e;
    return n;
}

PC_API ssize_t pwrite(int fd, const void *buf, size_t len, off_t off)
{
    struct iovec v = {(void *)buf, len};
    return pc_pwritev(fd, &v, 1, off, true);
}

PC_API ssize_t pwrite64(int fd, const void *buf, size_t len, off_t off)
{
    return pwrite(fd, buf, len, off);
}

PC_API ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off)
{
    return pc_pwritev(fd, iov, cnt, off, true);
}

PC_API ssize_t pwritev64(int fd, const struct iovec *iov, int cnt, off_t off)
{
    return pc_pwritev(fd, iov, cnt, off, true);
}

PC_API ssize_t write(int fd, const void *buf, size_t len)
{
    struct iovec v = {(void *)buf, len};
    return pc_pwritev(fd, &v, 1, 0, false);
}

PC_API ssize_t writev(int fd, const struct iovec *iov, int cnt)
{
    return pc_pwritev(fd, iov, cnt, 0, false);
}

static int pc_size(int fd, uint32_t kind, off_t off, off_t len, int mode)
{
    REAL(int, ftruncate, int, off_t);
    REAL(int, fallocate, int, int, off_t, off_t);
    pc_fd_t *f = pc_get(fd);
    int rc;
    if (f == NULL) {
        return kind == KVD_POWERCUT_SIZE ? real_ftruncate(fd, off)
                                         : real_fallocate(fd, mode, off, len);
    }
    pthread_mutex_lock(&pc_mu);
    pc_busy = true;
    rc = kind == KVD_POWERCUT_SIZE ? real_ftruncate(fd, off)
                                   : real_fallocate(fd, mode, off, len);
    int e = errno;
    if (rc == 0 &&
        (kind == KVD_POWERCUT_SIZE || (mode & FALLOC_FL_KEEP_SIZE) == 0)) {
        pc_log(f, kind, (uint64_t)off, (uint64_t)len, NULL);
        if (f->dsync) {
            pc_sync(f);
        }
    }
    pc_busy = false;
    pthread_mutex_unlock(&pc_mu);
    errno = e;
    return rc;
}

PC_API int ftruncate(int fd, off_t len)
{
    return pc_size(fd, KVD_POWERCUT_SIZE, len, 0, 0);
}

PC_API int ftruncate64(int fd, off_t len)
{
    return ftruncate(fd, len);
}

PC_API int fallocate(int fd, int mode, off_t off, off_t len)
{
    return pc_size(fd, KVD_POWERCUT_GROW, off, len, mode);
}

PC_API int fallocate64(int fd, int mode, off_t off, off_t len)
{
    return fallocate(fd, mode, off, len);
}

static int pc_fsync(int fd, bool data_only)
{
    REAL(int, fsync, int);
    REAL(int, fdatasync, int);
    if (pc_busy) {
        return data_only ? real_fdatasync(fd) : real_fsync(fd);
    }
    pthread_mutex_lock(&pc_mu);
    pc_busy = true;
    int rc = data_only ? real_fdatasync(fd) : real_fsync(fd);
    int e = errno;
    if (rc == 0 && fd >= 0 && fd < PC_FDS && pc_fds[fd].used) {
        if (pc_fds[fd].is_dir) {
            pc_sync_dir();
        } else {
            pc_sync(&pc_fds[fd]);
        }
    }
    pc_busy = false;
    pthread_mutex_unlock(&pc_mu);
    errno = e;
    return rc;
}

PC_API int fsync(int fd)
{
    return pc_fsync(fd, false);
}

PC_API int fdatasync(int fd)
{
    return pc_fsync(fd, true);
}
