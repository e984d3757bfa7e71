/*
 * `kvdepot lookup --text`: a prompt's text turned into the token ids the
 * engine would see, by the model's own tokenizer. Tokenizers live in
 * Python (Hugging Face transformers), so the CLI runs
 * `$KVDEPOT_PYTHON -m kvdepot.tokens --tokenizer NAME` (python/kvdepot/
 * tokens.py; KVDEPOT_PYTHON defaults to python3), writes the text to its
 * stdin and reads a JSON list of ids from its stdout. The child's stderr
 * is the CLI's, so its own explanation (no transformers, unknown
 * tokenizer) reaches the operator as it wrote it.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli_int.h"

extern char **environ;

/* Writes all of buf to fd; false on an error (EPIPE: the child is gone). */
static bool write_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t w = write(fd, buf, len);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            return false;
        }
        buf += w;
        len -= (size_t)w;
    }
    return true;
}

/* Reads fd to its end into a malloc'd NUL-terminated string of at most
 * max bytes; NULL when longer, or on an error. */
static char *read_all(int fd, size_t max)
{
    size_t cap = 4096, len = 0;
    char *out = malloc(cap + 1);
    while (out != NULL) {
        if (len == cap) {
            if (cap >= max) {
                free(out);
                return NULL;
            }
            cap = cap * 2 > max ? max : cap * 2;
            char *g = realloc(out, cap + 1);
            if (g == NULL) {
                free(out);
                return NULL;
            }
            out = g;
        }
        ssize_t r = read(fd, out + len, cap - len);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0) {
            free(out);
            return NULL;
        }
        if (r == 0) {
            out[len] = '\0';
            return out;
        }
        len += (size_t)r;
    }
    return NULL;
}

/* Starts the tokenizer with its stdin and stdout on pipes. */
static bool tokenizer_spawn(const char *python, char *const argv[], pid_t *pid,
                            int *to_child, int *from_child)
{
    int in[2] = {-1, -1}, out[2] = {-1, -1};
    posix_spawn_file_actions_t fa;
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0 ||
        posix_spawn_file_actions_init(&fa) != 0) {
        fprintf(stderr, "kvdepot lookup: pipe: %s\n", strerror(errno));
        goto fail;
    }
    posix_spawn_file_actions_adddup2(&fa, in[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
    int err = posix_spawnp(pid, python, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (err != 0) {
        fprintf(stderr,
                "kvdepot lookup: --text: cannot run %s: %s (set "
                "KVDEPOT_PYTHON to a Python with the kvdepot package and "
                "transformers)\n",
                python, strerror(err));
        goto fail;
    }
    close(in[0]);
    close(out[1]);
    *to_child = in[1];
    *from_child = out[0];
    return true;
fail:
    for (int i = 0; i < 2; i++) {
        if (in[i] >= 0) {
            close(in[i]);
        }
        if (out[i] >= 0) {
            close(out[i]);
        }
    }
    return false;
}

char *kvd_cli_tokenize(const char *tokenizer, const char *text, size_t len,
                       bool special, bool chat, size_t max_out)
{
    const char *python = getenv("KVDEPOT_PYTHON");
    if (python == NULL || python[0] == '\0') {
        python = "python3";
    }
    char *argv[8] = {(char *)python, "-m", "kvdepot.tokens", "--tokenizer",
                     (char *)tokenizer};
    int argc = 5;
    if (!special) {
        argv[argc++] = "--no-special-tokens";
    }
    if (chat) {
        argv[argc++] = "--chat";
    }
    argv[argc] = NULL;
    pid_t pid;
    int to_child, from_child;
    if (!tokenizer_spawn(python, argv, &pid, &to_child, &from_child)) {
        return NULL;
    }
    /* The child reads all of stdin before it writes: write, then read. A
     * child that dies early makes the write fail with EPIPE, not kill us. */
    struct sigaction ign = {.sa_handler = SIG_IGN}, old;
    sigaction(SIGPIPE, &ign, &old);
    bool wrote = write_all(to_child, text, len);
    close(to_child);
    sigaction(SIGPIPE, &old, NULL);
    char *ids = read_all(from_child, max_out);
    close(from_child);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !wrote ||
        ids == NULL) {
        fprintf(stderr,
                "kvdepot lookup: --text: tokenizing with '%s' failed (%s)\n",
                tokenizer,
                !WIFEXITED(status) ? "the tokenizer was killed"
                : WEXITSTATUS(status) != 0
                    ? "see its message above"
                    : (ids == NULL ? "its output is too long"
                                   : "it stopped reading the text"));
        free(ids);
        return NULL;
    }
    return ids;
}
