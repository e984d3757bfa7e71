/*
 * Corpus replay driver: feeds every regular file of the given directories
 * (or the given files) to LLVMFuzzerTestOneInput once. Used by ctest so the
 * corpus guards against regressions in every build, with or without clang
 * and libFuzzer. Fails if a directory holds no input at all, so a missing
 * corpus cannot pass silently.
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? cap * 2 : 4096;
            uint8_t *nbuf = realloc(buf, cap);
            if (nbuf == NULL) {
                free(buf);
                fclose(f);
                return -1;
            }
            buf = nbuf;
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0) {
            break;
        }
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        fprintf(stderr, "replay: %s: read error\n", path);
        free(buf);
        return -1;
    }
    /* An exact-size copy lets ASan catch reads one past the input. */
    uint8_t *exact = malloc(len ? len : 1);
    if (exact == NULL) {
        free(buf);
        return -1;
    }
    if (len) {
        memcpy(exact, buf, len);
    }
    free(buf);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    return 0;
}

static int replay_path(const char *path, size_t *count)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        (*count)++;
        return replay_file(path);
    }
    DIR *dir = opendir(path);
    if (dir == NULL) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(dir)) != NULL) {
        if (de->d_name[0] == '.') {
            continue;
        }
        char child[4096];
        int n = snprintf(child, sizeof(child), "%s/%s", path, de->d_name);
        if (n < 0 || (size_t)n >= sizeof(child)) {
            rc = -1;
            break;
        }
        rc = replay_path(child, count);
    }
    closedir(dir);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
        return 2;
    }
    size_t count = 0;
    for (int i = 1; i < argc; i++) {
        if (replay_path(argv[i], &count) != 0) {
            return 1;
        }
    }
    if (count == 0) {
        fprintf(stderr, "replay: no corpus inputs found\n");
        return 1;
    }
    printf("replay: %zu inputs ran cleanly\n", count);
    return 0;
}
