/*
 * A power-loss model for files, shared by the LD_PRELOAD library that
 * records what a process writes (tests/support/kvd_powercut.c) and the test
 * that cuts the power after killing that process
 * (tests/integration/test_store_powercut.c).
 *
 * The library watches the files directly inside $KVD_POWERCUT_DIR (not the
 * LMDB lock file, which is rebuilt at every open) and keeps, in
 * $KVD_POWERCUT_SHADOW, for each file NAME:
 *   NAME.img  its last durable image: the contents at the last fsync or
 *             fdatasync (every write through an O_DSYNC/O_SYNC descriptor is
 *             durable at once);
 *   NAME.log  the writes and size changes made since, in order (records
 *             below, each with its bytes);
 *   NAME.new  present while the file was created and its directory not yet
 *             synced: its name may vanish at a power loss.
 * kvd_powercut_cut(), run after the writer was SIGKILLed, replaces each file
 * with its durable image plus a seeded random subset of the unsynced writes
 * at 4 KiB granularity (each page ends as its durable version or as one of
 * the versions the log gave it, whatever the order of the writes, across
 * files too); a file whose name was not durable is removed with probability
 * 1/2. It then makes that result the new durable state (images rewritten,
 * logs and markers removed).
 *
 * Errors: the cut returns -1 with errno set and a message on stderr when a
 * file cannot be read or written. Threading: the cut is single-threaded and
 * must not run while a process with the library writes the same files.
 * Header-only (static inline), for tests.
 */
#ifndef KVD_TESTS_POWERCUT_H
#define KVD_TESTS_POWERCUT_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define KVD_POWERCUT_PAGE 4096u
#define KVD_POWERCUT_MAGIC 0x4b504331u /* "KPC1" */

enum {
    KVD_POWERCUT_WRITE = 1, /* len bytes at off follow the record */
    KVD_POWERCUT_SIZE = 2,  /* the file's size became off */
    KVD_POWERCUT_GROW = 3   /* the size became at least off + len */
};

typedef struct kvd_powercut_rec {
    uint32_t magic;
    uint32_t kind;
    uint64_t off;
    uint64_t len;
} kvd_powercut_rec_t;

/* What one cut did, summed over the files. */
typedef struct kvd_powercut_stats {
    uint64_t writes;        /* unsynced writes found in the logs */
    uint64_t pages_kept;    /* page versions that reached the "disk" */
    uint64_t pages_dropped; /* page versions lost */
    uint64_t names_lost;    /* files whose unsynced name was removed */
} kvd_powercut_stats_t;

static inline uint64_t kvd_powercut_rand(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Reads a whole file into a malloc'd buffer; 0 or -1. */
static inline int kvd_powercut_slurp(const char *path, uint8_t **buf,
                                     size_t *len)
{
    *buf = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno != ENOENT) {
            return -1;
        }
        *buf = malloc(1); /* no file: an empty image */
        return *buf != NULL ? 0 : -1;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return -1;
    }
    *buf = malloc((size_t)sb.st_size + 1);
    size_t got = 0;
    while (*buf != NULL && got < (size_t)sb.st_size) {
        ssize_t n = read(fd, *buf + got, (size_t)sb.st_size - got);
        if (n <= 0) {
            break;
        }
        got += (size_t)n;
    }
    close(fd);
    *len = got;
    return *buf != NULL ? 0 : -1;
}

static inline int kvd_powercut_spill(const char *path, const uint8_t *buf,
                                     size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        return -1;
    }
    size_t put = 0;
    while (put < len) {
        ssize_t n = write(fd, buf + put, len - put);
        if (n <= 0) {
            close(fd);
            return -1;
        }
        put += (size_t)n;
    }
    return close(fd);
}

/* Grows *buf to `want` bytes (zero-filled); 0 or -1. */
static inline int kvd_powercut_grow(uint8_t **buf, size_t *len, size_t *cap,
                                    size_t want)
{
    if (want > *cap) {
        size_t c = want + want / 2 + KVD_POWERCUT_PAGE;
        uint8_t *p = realloc(*buf, c);
        if (p == NULL) {
            return -1;
        }
        *buf = p;
        *cap = c;
    }
    if (want > *len) {
        memset(*buf + *len, 0, want - *len);
        *len = want;
    }
    return 0;
}

/* Cuts one file: `img`/`log` as read, result in *out. */
static inline int kvd_powercut_file(uint8_t *img, size_t img_len,
                                    const uint8_t *log, size_t log_len,
                                    uint64_t *rng, uint8_t **out,
                                    size_t *out_len, kvd_powercut_stats_t *st)
{
    size_t cur_cap = img_len, out_cap = img_len;
    uint8_t *cur = malloc(img_len + 1); /* the page cache's view, replayed */
    size_t cur_len = img_len;
    *out = malloc(img_len + 1);
    if (cur == NULL || *out == NULL) {
        free(cur);
        return -1;
    }
    memcpy(cur, img, img_len);
    memcpy(*out, img, img_len);
    *out_len = img_len;
    size_t at = 0;
    int rc = 0;
    while (rc == 0 && at + sizeof(kvd_powercut_rec_t) <= log_len) {
        kvd_powercut_rec_t r;
        memcpy(&r, log + at, sizeof r);
        at += sizeof r;
        size_t body = r.kind == KVD_POWERCUT_WRITE ? (size_t)r.len : 0;
        if (r.magic != KVD_POWERCUT_MAGIC || at + body > log_len) {
            break; /* the writer died inside this record: never done */
        }
        bool keep = (kvd_powercut_rand(rng) & 1u) != 0;
        if (r.kind == KVD_POWERCUT_WRITE) {
            st->writes++;
            rc = kvd_powercut_grow(&cur, &cur_len, &cur_cap,
                                   (size_t)(r.off + r.len));
            if (rc != 0) {
                break;
            }
            memcpy(cur + r.off, log + at, (size_t)r.len);
            uint64_t first = r.off / KVD_POWERCUT_PAGE;
            uint64_t last = (r.off + r.len - 1) / KVD_POWERCUT_PAGE;
            for (uint64_t p = first; r.len > 0 && p <= last; p++) {
                if ((kvd_powercut_rand(rng) & 1u) == 0) {
                    st->pages_dropped++;
                    continue;
                }
                st->pages_kept++;
                size_t lo = (size_t)(p * KVD_POWERCUT_PAGE);
                size_t hi = lo + KVD_POWERCUT_PAGE;
                hi = hi < cur_len ? hi : cur_len;
                rc = kvd_powercut_grow(out, out_len, &out_cap, hi);
                if (rc != 0) {
                    break;
                }
                memcpy(*out + lo, cur + lo, hi - lo);
            }
        } else {
            size_t size = (size_t)r.off;
            if (r.kind == KVD_POWERCUT_GROW) {
                size = (size_t)(r.off + r.len);
                size = size > cur_len ? size : cur_len;
            }
            rc = kvd_powercut_grow(&cur, &cur_len, &cur_cap, size);
            cur_len = size;
            if (rc == 0 && keep) {
                rc = kvd_powercut_grow(out, out_len, &out_cap, size);
                *out_len = size;
            }
        }
        at += body;
    }
    free(cur);
    return rc;
}

/* Cuts the power on every watched file (see above); `seed` makes it
 * replayable; `lose_names` removes every file whose name was not durable
 * (the worst case) instead of half of them. 0, or -1 with errno set. */
static inline int kvd_powercut_cut(const char *dir, const char *shadow,
                                   uint64_t seed, bool lose_names,
                                   kvd_powercut_stats_t *st)
{
    memset(st, 0, sizeof *st);
    DIR *d = opendir(shadow);
    if (d == NULL) {
        return -1;
    }
    uint64_t rng = seed * 0x9e3779b97f4a7c15ull + 1;
    struct dirent *e;
    int rc = 0;
    char p[1024], q[1024];
    while (rc == 0 && (e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (n < 5 || strcmp(e->d_name + n - 4, ".img") != 0) {
            continue;
        }
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)(n - 4), e->d_name);
        uint8_t *img, *log, *out = NULL;
        size_t img_len, log_len, out_len = 0;
        snprintf(p, sizeof p, "%s/%s.img", shadow, name);
        snprintf(q, sizeof q, "%s/%s.log", shadow, name);
        rc = kvd_powercut_slurp(p, &img, &img_len);
        if (rc == 0) {
            rc = kvd_powercut_slurp(q, &log, &log_len);
            if (rc == 0) {
                rc = kvd_powercut_file(img, img_len, log, log_len, &rng, &out,
                                       &out_len, st);
                free(log);
            }
            free(img);
        }
        (void)unlink(q);
        snprintf(q, sizeof q, "%s/%s.new", shadow, name);
        bool lost = false;
        if (rc == 0 && access(q, F_OK) == 0) {
            lost = lose_names || (kvd_powercut_rand(&rng) & 1u) != 0;
            (void)unlink(q);
        }
        snprintf(q, sizeof q, "%s/%s", dir, name);
        if (rc == 0 && lost) {
            st->names_lost++;
            (void)unlink(q);
            (void)unlink(p);
        } else if (rc == 0) {
            rc = kvd_powercut_spill(q, out, out_len);
            if (rc == 0) {
                rc = kvd_powercut_spill(p, out, out_len);
            }
        }
        if (rc != 0) {
            fprintf(stderr, "powercut: %s: %s\n", name, strerror(errno));
        }
        free(out);
    }
    closedir(d);
    return rc;
}

#endif /* KVD_TESTS_POWERCUT_H */
