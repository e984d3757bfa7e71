/*
 * The memory an arena's prefault may take (store/arena_int.h,
 * kvd_arena_memory_room): MemAvailable, a cgroup v2 limit (the tightest of
 * the cgroup and its ancestors), a cgroup v1 limit (its own or the
 * hierarchy's, or the mount's in a container), reclaimable file pages
 * counted as free, "no limit" in both versions, and nothing readable; read
 * from trees of files made here. Then the real thing, where the test may
 * make a memory cgroup (root, cgroup v1 or v2 with the memory controller):
 * a child in a 256 MiB cgroup asks for an arena of 512 MiB with prefault
 * and gets KVD_ERR_NOMEM, where it used to be killed by the OOM killer
 * half-way through the prefault; 64 MiB still opens.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvd_testarena_int.h"
#include "store/arena_int.h"
#include "tests/unit/kvd_testdir_int.h"

/* Writes `text` to root/rel, making the directories on the way. */
static void put(const char *root, const char *rel, const char *text)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    for (char *p = path + strlen(root) + 1; *p != '\0'; p++) {
        if (*p == '/') {
            *p = '\0';
            (void)mkdir(path, 0700);
            *p = '/';
        }
    }
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_true(fputs(text, f) >= 0);
    assert_int_equal(fclose(f), 0);
}

/* Writes each (path, text) pair of `files` (NULL-terminated) under d. */
static void tree(const kvd_test_dir_t *d, const char *const *files)
{
    for (size_t i = 0; files[i] != NULL; i += 2) {
        put(d->path, files[i], files[i + 1]);
    }
}

/* The room and limit read from d's tree are `room` and `limit`. */
static void expect(const kvd_test_dir_t *d, uint64_t room, uint64_t limit)
{
    uint64_t r = 0, l = 0;
    kvd_arena_memory_room(d->path, &r, &l);
    assert_int_equal(r, room);
    assert_int_equal(l, limit);
}

static int dir_setup(void **state)
{
    kvd_test_dir_t *d = malloc(sizeof *d);
    if (d == NULL) {
        return -1;
    }
    kvd_test_dir_make(d, "memroom");
    *state = d;
    return 0;
}

static int dir_teardown(void **state)
{
    kvd_test_dir_remove(*state);
    free(*state);
    return 0;
}

#define NONE UINT64_MAX
#define MEMINFO_100G "proc/meminfo", "MemAvailable: 100000000 kB\n"

static void test_meminfo_only(void **state)
{
    const kvd_test_dir_t *d = *state;
    expect(d, NONE, NONE); /* nothing to read */
    put(d->path, "proc/meminfo",
        "MemTotal:       4000000 kB\nMemFree:     10 kB\n"
        "MemAvailable:    1000000 kB\nBuffers: 5 kB\n");
    expect(d, 1000000ull * 1024, NONE);
    /* No memory line: a cgroup without the memory controller. */
    put(d->path, "proc/self/cgroup", "3:cpu,cpuacct:/x\n1:name=systemd:/x\n");
    expect(d, 1000000ull * 1024, NONE);
}

static void test_cgroup_v2(void **state)
{
    const kvd_test_dir_t *d = *state;
    /* The process's own cgroup has no limit; its parent does. */
    static const char *const files[] = {
        MEMINFO_100G,
        "proc/self/cgroup",
        "0::/pod/engine\n",
        "sys/fs/cgroup/pod/engine/memory.max",
        "max\n",
        "sys/fs/cgroup/pod/engine/memory.current",
        "5000\n",
        "sys/fs/cgroup/pod/memory.max",
        "1048576000\n",
        "sys/fs/cgroup/pod/memory.current",
        "300000000\n",
        "sys/fs/cgroup/pod/memory.stat",
        "anon 150000000\nfile 150000000\nactive_file 50000000\n"
        "inactive_file 100000000\n",
        NULL};
    tree(d, files);
    /* 1048576000 - (300000000 - 100000000 reclaimable). */
    expect(d, 848576000ull, 1048576000ull);
    /* A tighter limit in the cgroup itself wins. */
    put(d->path, "sys/fs/cgroup/pod/engine/memory.max", "10000\n");
    expect(d, 5000ull, 10000ull);
    /* Held beyond the limit: no room, not a wrapped-around figure. */
    put(d->path, "sys/fs/cgroup/pod/engine/memory.current", "20000\n");
    expect(d, 0, 10000ull);
}

static void test_cgroup_v1(void **state)
{
    const kvd_test_dir_t *d = *state;
    static const char *const files[] = {
        MEMINFO_100G,
        "proc/self/cgroup",
        "12:pids:/kv\n7:cpuset,memory:/kv\n1:name=systemd:/kv\n",
        "sys/fs/cgroup/memory/kv/memory.limit_in_bytes",
        "536870912\n",
        "sys/fs/cgroup/memory/kv/memory.usage_in_bytes",
        "100000000\n",
        "sys/fs/cgroup/memory/kv/memory.stat",
        "cache 60000000\nhierarchical_memory_limit 9223372036854771712\n"
        "total_inactive_file 50000000\n",
        NULL};
    tree(d, files);
    expect(d, 536870912ull - 50000000ull, 536870912ull);
    /* An ancestor's tighter limit, as the hierarchy reports it. */
    put(d->path, "sys/fs/cgroup/memory/kv/memory.stat",
        "hierarchical_memory_limit 268435456\n"
        "total_inactive_file 50000000\n");
    expect(d, 268435456ull - 50000000ull, 268435456ull);
    /* "No limit" (a page-rounded LONG_MAX): MemAvailable decides. */
    static const char *const unlimited[] = {
        "sys/fs/cgroup/memory/kv/memory.limit_in_bytes",
        "9223372036854771712\n", "sys/fs/cgroup/memory/kv/memory.stat",
        "hierarchical_memory_limit 9223372036854771712\n", NULL};
    tree(d, unlimited);
    expect(d, 100000000ull * 1024, NONE);
}

/* A container sees its own cgroup at the mount while /proc/self/cgroup
 * names the host's path. */
static void test_cgroup_v1_container(void **state)
{
    const kvd_test_dir_t *d = *state;
    static const char *const files[] = {
        MEMINFO_100G,
        "proc/self/cgroup",
        "9:memory:/kubepods/pod1/abc\n",
        "sys/fs/cgroup/memory/memory.limit_in_bytes",
        "1073741824\n",
        "sys/fs/cgroup/memory/memory.usage_in_bytes",
        "73741824\n",
        NULL};
    tree(d, files);
    expect(d, 1000000000ull, 1073741824ull);
}

/* ---- a real memory cgroup ----------------------------------------------- */

static bool write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        return false;
    }
    bool ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok;
}

/* Makes a memory cgroup limited to `bytes` (v1, else v2 where the root
 * delegates the memory controller); false when this process cannot. */
static bool cgroup_make(char *dir, size_t len, uint64_t bytes)
{
    char limit[32];
    snprintf(limit, sizeof limit, "%llu", (unsigned long long)bytes);
    const char *v1 = "/sys/fs/cgroup/memory";
    snprintf(dir, len, "%s/kvd_test_memroom_%d", v1, (int)getpid());
    char f[600];
    if (mkdir(dir, 0700) == 0) {
        snprintf(f, sizeof f, "%s/memory.limit_in_bytes", dir);
        if (write_file(f, limit)) {
            return true;
        }
        (void)rmdir(dir);
    }
    FILE *sc = fopen("/sys/fs/cgroup/cgroup.subtree_control", "r");
    char ctl[256] = "";
    if (sc != NULL) {
        if (fgets(ctl, sizeof ctl, sc) == NULL) {
            ctl[0] = '\0';
        }
        fclose(sc);
    }
    if (strstr(ctl, "memory") == NULL) {
        return false;
    }
    snprintf(dir, len, "/sys/fs/cgroup/kvd_test_memroom_%d", (int)getpid());
    if (mkdir(dir, 0700) != 0) {
        return false;
    }
    snprintf(f, sizeof f, "%s/memory.max", dir);
    if (!write_file(f, limit)) {
        (void)rmdir(dir);
        return false;
    }
    return true;
}

/* The child: joins the cgroup, then 0 when the big arena is refused with
 * KVD_ERR_NOMEM and the small one opens; another code says which failed.
 * (No cmocka asserts in a forked child.) */
static int child_main(const char *dir)
{
    char f[600], pid[32];
    snprintf(f, sizeof f, "%s/cgroup.procs", dir);
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    if (!write_file(f, pid)) {
        return 10;
    }
    kvd_arena_config_t cfg =
        test_config(512 * MIB, MIB, KVD_ARENA_HUGEPAGES_OFF, true);
    kvd_arena_t *arena = NULL;
    kvd_status_t st = kvd_arena_create(&cfg, &arena);
    if (st != KVD_ERR_NOMEM || arena != NULL) {
        return 11;
    }
    cfg = test_config(64 * MIB, MIB, KVD_ARENA_HUGEPAGES_OFF, true);
    if (kvd_arena_create(&cfg, &arena) != KVD_OK) {
        return 12;
    }
    kvd_arena_destroy(arena);
    return 0;
}

static void test_prefault_beyond_cgroup_refused(void **state)
{
    (void)state;
    char dir[512];
    if (geteuid() != 0 || !cgroup_make(dir, sizeof dir, 256 * MIB)) {
        fprintf(stderr, "# no memory cgroup to make here: skipped\n");
        skip();
    }
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        _exit(child_main(dir));
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    (void)rmdir(dir); /* empty once the child is gone */
    if (WIFSIGNALED(status)) {
        fail_msg("the child was killed by signal %d (the OOM killer: the "
                 "prefault ran past the cgroup's limit)",
                 WTERMSIG(status));
    }
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_meminfo_only, dir_setup,
                                        dir_teardown),
        cmocka_unit_test_setup_teardown(test_cgroup_v2, dir_setup,
                                        dir_teardown),
        cmocka_unit_test_setup_teardown(test_cgroup_v1, dir_setup,
                                        dir_teardown),
        cmocka_unit_test_setup_teardown(test_cgroup_v1_container, dir_setup,
                                        dir_teardown),
        cmocka_unit_test(test_prefault_beyond_cgroup_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
