/*
 * Configuration: storage, the YAML loader and table-driven resolution (the
 * contract is in include/kvdepot/common.h, "Configuration"; the value
 * parsers are in config_parse.c).
 *
 * A kvd_config_t holds two flat lists of key -> text: one loaded from YAML
 * files and one set by the caller. Nothing is parsed until
 * kvd_config_apply(), which walks a component's field table and, for each
 * field, takes the first text found in: call parameters, KVDEPOT_<NAME>,
 * the file, the default. Keeping raw text until then is what lets one
 * config serve several components, each applying its own table, and lets
 * every error name the field, the source and the reason.
 *
 * The YAML side accepts only what a settings file needs: one document whose
 * root is a mapping, nested mappings joined with '.'; a nested mapping is
 * also an entry of its own ("k=v,..." of its scalars: pairs fields) and a
 * sequence of scalars one entry ("a,b": list fields); apply refuses them
 * for any other field. Nested sequences, aliases, anchors, tags and
 * complex keys are rejected with their line, so a typo never silently
 * turns into a different structure.
 * Depth, key length and key count are bounded because the bytes may be
 * hostile (the fuzzer feeds this file). This is the only file that includes
 * yaml.h.
 *
 * Value text rules are in config_parse.c.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <yaml.h>

#include "common/config_int.h"
#include "common/log_int.h"

/* Bounds against hostile YAML: nesting, joined key length, keys per file. */
#define KVD_CONFIG_DEPTH_MAX 16
#define KVD_CONFIG_KEYS_MAX 10000
/* Config files are small; refuse to slurp anything absurd. */
#define KVD_CONFIG_FILE_MAX (16u << 20)
#define KVD_CONFIG_ENV_PREFIX "KVDEPOT_"

/* What a file gave a key: a scalar, a sequence of scalars (the value is
 * its items joined with ','), or a nested mapping (the value is its
 * scalar members as "k=v,..."; its members are entries of their own). */
typedef enum kvd_config_shape {
    KVD_CONFIG_SHAPE_SCALAR,
    KVD_CONFIG_SHAPE_LIST,
    KVD_CONFIG_SHAPE_MAP
} kvd_config_shape_t;

typedef struct kvd_config_entry {
    char *key; /* one allocation holds key, value and origin */
    char *value;
    char *origin; /* file path or "<yaml>"; NULL for call parameters */
    unsigned line;
    kvd_config_shape_t shape;
    /* Why a mapping is no map of scalars, with the line; or NULL. */
    char *problem;
} kvd_config_entry_t;

typedef struct kvd_config_list {
    kvd_config_entry_t *items;
    size_t count;
    size_t cap;
} kvd_config_list_t;

struct kvd_config {
    /* Guards both lists: the header promises thread-safe calls, and one
     * config may be applied by several components' threads. */
    pthread_mutex_t lock;
    kvd_config_list_t file;
    kvd_config_list_t call;
};

/* ------------------------------------------------------------------------ */
/* Key/value lists                                                          */
/* ------------------------------------------------------------------------ */

static kvd_status_t entry_init(kvd_config_entry_t *entry, const char *key,
                               const char *value, const char *origin,
                               unsigned line)
{
    size_t klen = strlen(key) + 1;
    size_t vlen = strlen(value) + 1;
    size_t olen = origin != NULL ? strlen(origin) + 1 : 0;
    char *block = malloc(klen + vlen + olen);
    if (block == NULL) {
        return KVD_ERR_NOMEM;
    }
    entry->key = memcpy(block, key, klen);
    entry->value = memcpy(block + klen, value, vlen);
    entry->origin =
        origin != NULL ? memcpy(block + klen + vlen, origin, olen) : NULL;
    entry->line = line;
    entry->shape = KVD_CONFIG_SHAPE_SCALAR;
    entry->problem = NULL;
    return KVD_OK;
}

static void entry_cleanup(kvd_config_entry_t *entry)
{
    free(entry->key);
    entry->key = NULL;
    free(entry->problem);
    entry->problem = NULL;
}

static kvd_status_t list_reserve(kvd_config_list_t *list, size_t n)
{
    if (n <= list->cap) {
        return KVD_OK;
    }
    size_t cap = list->cap ? list->cap : 16;
    while (cap < n) {
        cap *= 2;
    }
    kvd_config_entry_t *items = realloc(list->items, cap * sizeof(*items));
    if (items == NULL) {
        return KVD_ERR_NOMEM;
    }
    list->items = items;
    list->cap = cap;
    return KVD_OK;
}

static const kvd_config_entry_t *list_find(const kvd_config_list_t *list,
                                           const char *key)
{
    for (size_t i = 0; i < list->count; i++) {
        if (strcmp(list->items[i].key, key) == 0) {
            return &list->items[i];
        }
    }
    return NULL;
}

static void list_cleanup(kvd_config_list_t *list)
{
    for (size_t i = 0; i < list->count; i++) {
        entry_cleanup(&list->items[i]);
    }
    free(list->items);
    list->items = NULL;
    list->count = list->cap = 0;
}

/* Moves every entry of `from` into `to`, replacing equal keys. Capacity is
 * reserved first so the merge itself cannot fail half-way. */
static kvd_status_t list_merge(kvd_config_list_t *to, kvd_config_list_t *from)
{
    kvd_status_t st = list_reserve(to, to->count + from->count);
    if (st != KVD_OK) {
        return st;
    }
    for (size_t i = 0; i < from->count; i++) {
        kvd_config_entry_t *old =
            (kvd_config_entry_t *)list_find(to, from->items[i].key);
        if (old != NULL) {
            entry_cleanup(old);
            *old = from->items[i];
        } else {
            to->items[to->count++] = from->items[i];
        }
    }
    from->count = 0;
    list_cleanup(from);
    return KVD_OK;
}

KVD_API kvd_status_t kvd_config_create(kvd_config_t **config_out)
{
    if (config_out == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_config_t *config = calloc(1, sizeof(*config));
    if (config == NULL) {
        return KVD_ERR_NOMEM;
    }
    if (pthread_mutex_init(&config->lock, NULL) != 0) {
        free(config);
        return KVD_ERR_NOMEM;
    }
    *config_out = config;
    return KVD_OK;
}

KVD_API void kvd_config_destroy(kvd_config_t *config)
{
    if (config == NULL) {
        return;
    }
    list_cleanup(&config->file);
    list_cleanup(&config->call);
    pthread_mutex_destroy(&config->lock);
    free(config);
}

/* apply() and print() take a const config but still serialise with
 * writers: the lock is the one mutable part of the object. */
static void config_lock(const kvd_config_t *config)
{
    if (config != NULL) {
        pthread_mutex_lock((pthread_mutex_t *)&config->lock);
    }
}

static void config_unlock(const kvd_config_t *config)
{
    if (config != NULL) {
        pthread_mutex_unlock((pthread_mutex_t *)&config->lock);
    }
}

KVD_API kvd_status_t kvd_config_set(kvd_config_t *config, const char *name,
                                    const char *value)
{
    if (config == NULL || name == NULL || value == NULL || name[0] == '\0' ||
        strlen(name) > KVD_CONFIG_KEY_MAX) {
        return KVD_ERR_INVALID;
    }
    kvd_config_entry_t entry;
    kvd_status_t st = entry_init(&entry, name, value, NULL, 0);
    if (st != KVD_OK) {
        return st;
    }
    config_lock(config);
    kvd_config_entry_t *old =
        (kvd_config_entry_t *)list_find(&config->call, name);
    if (old != NULL) {
        entry_cleanup(old);
        *old = entry;
    } else {
        st = list_reserve(&config->call, config->call.count + 1);
        if (st == KVD_OK) {
            config->call.items[config->call.count++] = entry;
        } else {
            entry_cleanup(&entry);
        }
    }
    config_unlock(config);
    return st;
}

/* ------------------------------------------------------------------------ */
/* YAML loading                                                             */
/* ------------------------------------------------------------------------ */

/* A growing text buffer of the walk (a mapping's pairs, a sequence). */
typedef struct kvd_yaml_text {
    char *buf;
    size_t len, cap;
} kvd_yaml_text_t;

/* One open mapping: its scalar values joined as "k=v,..." for a field
 * that takes pairs, or why they cannot be (then `problem` is not ""). */
typedef struct kvd_yaml_level {
    kvd_yaml_text_t join;
    unsigned line; /* where the mapping starts */
    char problem[KVD_CONFIG_QUOTE_MAX + 64];
} kvd_yaml_level_t;

/* State of one walk over the event stream of one YAML document. */
typedef struct kvd_yaml_walk {
    kvd_config_list_t keys; /* what this file defines, merged on success */
    const char *origin;
    char path[KVD_CONFIG_KEY_MAX + 1]; /* joined key being built */
    /* base[d]: length of `path` before the key of mapping level d. */
    size_t base[KVD_CONFIG_DEPTH_MAX + 1];
    kvd_yaml_level_t level[KVD_CONFIG_DEPTH_MAX + 1];
    unsigned depth; /* open mappings; 0 = outside the root mapping */
    bool have_key;  /* the current level has read a key, wants a value */
    bool root_done; /* the document root has been seen */
    bool in_seq;    /* inside the sequence that is the current key's value */
    kvd_yaml_text_t seq; /* its items joined with ',' */
    unsigned seq_line;
    unsigned key_line; /* of the key the current level has read */
    unsigned line;     /* of the event that failed */
    char reason[192];
} kvd_yaml_walk_t;

static void walk_cleanup(kvd_yaml_walk_t *w)
{
    for (size_t d = 0; d <= KVD_CONFIG_DEPTH_MAX; d++) {
        free(w->level[d].join.buf);
    }
    free(w->seq.buf);
    list_cleanup(&w->keys);
}

/* Appends `sep` (unless the text is empty or sep is 0) and n bytes of s. */
static kvd_status_t text_add(kvd_yaml_text_t *t, char sep, const char *s,
                             size_t n)
{
    size_t need = t->len + 1 + n + 1;
    if (need > t->cap) {
        size_t cap = t->cap ? t->cap : 64;
        while (cap < need) {
            cap *= 2;
        }
        char *buf = realloc(t->buf, cap);
        if (buf == NULL) {
            return KVD_ERR_NOMEM;
        }
        t->buf = buf;
        t->cap = cap;
    }
    if (t->len > 0 && sep != '\0') {
        t->buf[t->len++] = sep;
    }
    memcpy(t->buf + t->len, s, n);
    t->len += n;
    t->buf[t->len] = '\0';
    return KVD_OK;
}

__attribute__((format(printf, 3, 4))) static kvd_status_t
walk_fail(kvd_yaml_walk_t *w, const yaml_event_t *ev, const char *fmt, ...)
{
    w->line = (unsigned)ev->start_mark.line + 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->reason, sizeof(w->reason), fmt, ap);
    va_end(ap);
    return KVD_ERR_INVALID;
}

/* The key the current level has read (the part after the last '.'). */
static const char *walk_key(const kvd_yaml_walk_t *w)
{
    size_t base = w->base[w->depth];
    return w->path + base + (base ? 1 : 0);
}

/* Notes why level d is not a mapping of scalars (the first reason). */
__attribute__((format(printf, 4, 5))) static void
level_problem(kvd_yaml_walk_t *w, unsigned d, unsigned line, const char *fmt,
              ...)
{
    kvd_yaml_level_t *lv = &w->level[d];
    if (lv->problem[0] != '\0') {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(lv->problem, sizeof lv->problem, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n + 16 < sizeof lv->problem) {
        snprintf(lv->problem + n, sizeof lv->problem - (size_t)n, " (line %u)",
                 line);
    }
}

/* Adds key=value to level d's pairs, or notes why it cannot be one. */
static kvd_status_t level_join(kvd_yaml_walk_t *w, unsigned d, unsigned line,
                               const char *key, const char *value)
{
    if (w->level[d].problem[0] != '\0') {
        return KVD_OK;
    }
    if (strchr(key, ',') != NULL) {
        level_problem(w, d, line, "the key '%.*s' holds a ','",
                      KVD_CONFIG_QUOTE_MAX, key);
        return KVD_OK;
    }
    if (strpbrk(value, ",=") != NULL || value[0] == '\0') {
        level_problem(w, d, line,
                      "the value of '%.*s' is empty or holds a ',' or '='",
                      KVD_CONFIG_QUOTE_MAX, key);
        return KVD_OK;
    }
    kvd_yaml_text_t *t = &w->level[d].join;
    kvd_status_t st = text_add(t, ',', key, strlen(key));
    return st == KVD_OK ? text_add(t, '=', value, strlen(value)) : st;
}

static kvd_status_t walk_check_plain(kvd_yaml_walk_t *w, const yaml_event_t *ev,
                                     const yaml_char_t *anchor,
                                     const yaml_char_t *tag)
{
    if (anchor != NULL) {
        return walk_fail(w, ev, "anchors are not supported ('&%.64s')",
                         (const char *)anchor);
    }
    if (tag != NULL) {
        return walk_fail(w, ev, "tags are not supported ('%.64s')",
                         (const char *)tag);
    }
    return KVD_OK;
}

/* Records `path` = value (one entry of the file) of the given shape; a
 * mapping seen twice keeps the later one's pairs, anything else twice is
 * an error. */
static kvd_status_t walk_entry(kvd_yaml_walk_t *w, const yaml_event_t *ev,
                               unsigned line, const char *value,
                               kvd_config_shape_t shape, const char *problem)
{
    kvd_config_entry_t *dup =
        (kvd_config_entry_t *)list_find(&w->keys, w->path);
    if (dup != NULL && !(shape == KVD_CONFIG_SHAPE_MAP &&
                         dup->shape == KVD_CONFIG_SHAPE_MAP)) {
        return walk_fail(w, ev, "duplicate key '%s' (first set on line %u)",
                         w->path, dup->line);
    }
    if (dup == NULL && w->keys.count >= KVD_CONFIG_KEYS_MAX) {
        return walk_fail(w, ev, "more than %d keys", KVD_CONFIG_KEYS_MAX);
    }
    kvd_config_entry_t entry;
    kvd_status_t st =
        dup != NULL ? KVD_OK : list_reserve(&w->keys, w->keys.count + 1);
    if (st == KVD_OK) {
        st = entry_init(&entry, w->path, value, w->origin, line);
    }
    if (st == KVD_OK && problem != NULL && problem[0] != '\0') {
        entry.problem = strdup(problem);
        if (entry.problem == NULL) {
            entry_cleanup(&entry);
            st = KVD_ERR_NOMEM;
        }
    }
    if (st != KVD_OK) {
        w->line = line;
        snprintf(w->reason, sizeof(w->reason), "out of memory");
        return st;
    }
    entry.shape = shape;
    if (dup != NULL) {
        entry_cleanup(dup);
        *dup = entry;
    } else {
        w->keys.items[w->keys.count++] = entry;
    }
    return KVD_OK;
}

static kvd_status_t walk_mapping_start(kvd_yaml_walk_t *w,
                                       const yaml_event_t *ev)
{
    kvd_status_t st = walk_check_plain(w, ev, ev->data.mapping_start.anchor,
                                       ev->data.mapping_start.tag);
    if (st != KVD_OK) {
        return st;
    }
    if (w->depth == 0) {
        if (w->root_done) {
            return walk_fail(w, ev, "more than one top-level node");
        }
        w->root_done = true;
        w->depth = 1;
        w->base[1] = 0;
        w->path[0] = '\0';
        w->have_key = false;
        w->level[1].problem[0] = '\0';
        w->level[1].join.len = 0;
        return KVD_OK;
    }
    if (w->in_seq) {
        return walk_fail(w, ev,
                         "a list of '%s' holds a mapping (lists hold "
                         "scalars only)",
                         w->path);
    }
    if (!w->have_key) {
        return walk_fail(w, ev, "mapping keys must be scalars");
    }
    if (w->depth >= KVD_CONFIG_DEPTH_MAX) {
        return walk_fail(w, ev, "mappings nested deeper than %d levels",
                         KVD_CONFIG_DEPTH_MAX);
    }
    unsigned line = (unsigned)ev->start_mark.line + 1;
    level_problem(w, w->depth, line, "the value of '%.*s' is a mapping",
                  KVD_CONFIG_QUOTE_MAX, walk_key(w));
    w->depth++;
    w->base[w->depth] = strlen(w->path);
    w->have_key = false;
    w->level[w->depth].line = w->key_line; /* errors name the key's line */
    w->level[w->depth].problem[0] = '\0';
    w->level[w->depth].join.len = 0;
    return KVD_OK;
}

/* A nested mapping ends: it becomes an entry of its own whose value is
 * its pairs, for a field that takes pairs (its leaves are entries too). */
static kvd_status_t walk_mapping_end(kvd_yaml_walk_t *w, const yaml_event_t *ev)
{
    kvd_status_t st = KVD_OK;
    if (w->depth > 1) {
        kvd_yaml_level_t *lv = &w->level[w->depth];
        w->path[w->base[w->depth]] = '\0';
        st = walk_entry(w, ev, lv->line, lv->join.len ? lv->join.buf : "",
                        KVD_CONFIG_SHAPE_MAP, lv->problem);
    }
    w->depth--;
    if (w->depth > 0) {
        /* The nested mapping was the value of the parent's key. */
        w->path[w->base[w->depth]] = '\0';
        w->have_key = false;
    }
    return st;
}

static kvd_status_t walk_sequence_start(kvd_yaml_walk_t *w,
                                        const yaml_event_t *ev)
{
    kvd_status_t st = walk_check_plain(w, ev, ev->data.sequence_start.anchor,
                                       ev->data.sequence_start.tag);
    if (st != KVD_OK) {
        return st;
    }
    if (w->depth == 0) {
        return walk_fail(w, ev, "the top level must be a mapping");
    }
    if (w->in_seq) {
        return walk_fail(w, ev,
                         "a list of '%s' holds a list (lists hold "
                         "scalars only)",
                         w->path);
    }
    if (!w->have_key) {
        return walk_fail(w, ev, "mapping keys must be scalars");
    }
    w->in_seq = true;
    w->seq.len = 0;
    w->seq_line = w->key_line;
    level_problem(w, w->depth, (unsigned)ev->start_mark.line + 1,
                  "the value of '%.*s' is a list", KVD_CONFIG_QUOTE_MAX,
                  walk_key(w));
    return KVD_OK;
}

/* The sequence ends: one entry, its items joined with ','. */
static kvd_status_t walk_sequence_end(kvd_yaml_walk_t *w,
                                      const yaml_event_t *ev)
{
    kvd_status_t st =
        walk_entry(w, ev, w->seq_line, w->seq.len ? w->seq.buf : "",
                   KVD_CONFIG_SHAPE_LIST, NULL);
    w->in_seq = false;
    w->path[w->base[w->depth]] = '\0';
    w->have_key = false;
    return st;
}

static kvd_status_t walk_seq_item(kvd_yaml_walk_t *w, const yaml_event_t *ev,
                                  const char *text, size_t len)
{
    if (len == 0 || memchr(text, ',', len) != NULL) {
        return walk_fail(w, ev,
                         "a list item of '%s' is empty or holds a ',': '%.*s'",
                         w->path, KVD_CONFIG_QUOTE_MAX, text);
    }
    if (w->seq.len + len > KVD_CONFIG_FILE_MAX) {
        return walk_fail(w, ev, "the list of '%s' is too long", w->path);
    }
    if (text_add(&w->seq, ',', text, len) != KVD_OK) {
        w->line = (unsigned)ev->start_mark.line + 1;
        snprintf(w->reason, sizeof(w->reason), "out of memory");
        return KVD_ERR_NOMEM;
    }
    return KVD_OK;
}

static kvd_status_t walk_scalar(kvd_yaml_walk_t *w, const yaml_event_t *ev)
{
    const char *text = (const char *)ev->data.scalar.value;
    size_t len = ev->data.scalar.length;
    kvd_status_t st =
        walk_check_plain(w, ev, ev->data.scalar.anchor, ev->data.scalar.tag);
    if (st != KVD_OK) {
        return st;
    }
    if (w->depth == 0) {
        /* A document holding nothing ("---" alone) is an empty config. */
        if (len == 0 && ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
            !w->root_done) {
            w->root_done = true;
            return KVD_OK;
        }
        return walk_fail(w, ev, "the top level must be a mapping");
    }
    if (strlen(text) != len) {
        return walk_fail(w, ev, "NUL byte in a %s",
                         w->have_key ? "value" : "key");
    }
    if (w->in_seq) {
        return walk_seq_item(w, ev, text, len);
    }
    if (!w->have_key) {
        size_t base = w->base[w->depth];
        size_t need = base + (base ? 1 : 0) + len;
        if (len == 0) {
            return walk_fail(w, ev, "empty key");
        }
        if (need > KVD_CONFIG_KEY_MAX) {
            return walk_fail(w, ev, "key longer than %d bytes",
                             KVD_CONFIG_KEY_MAX);
        }
        if (base) {
            w->path[base] = '.';
        }
        memcpy(w->path + base + (base ? 1 : 0), text, len + 1);
        w->have_key = true;
        w->key_line = (unsigned)ev->start_mark.line + 1;
        return KVD_OK;
    }
    unsigned line = (unsigned)ev->start_mark.line + 1;
    st = walk_entry(w, ev, line, text, KVD_CONFIG_SHAPE_SCALAR, NULL);
    if (st == KVD_OK && w->depth > 1) {
        st = level_join(w, w->depth, line, walk_key(w), text);
        if (st != KVD_OK) {
            w->line = line;
            snprintf(w->reason, sizeof(w->reason), "out of memory");
        }
    }
    w->path[w->base[w->depth]] = '\0';
    w->have_key = false;
    return st;
}

static kvd_status_t walk_event(kvd_yaml_walk_t *w, const yaml_event_t *ev)
{
    switch (ev->type) {
    case YAML_DOCUMENT_START_EVENT:
        if (w->root_done) {
            return walk_fail(w, ev, "more than one YAML document");
        }
        return KVD_OK;
    case YAML_MAPPING_START_EVENT: return walk_mapping_start(w, ev);
    case YAML_MAPPING_END_EVENT: return walk_mapping_end(w, ev);
    case YAML_SCALAR_EVENT: return walk_scalar(w, ev);
    case YAML_SEQUENCE_START_EVENT: return walk_sequence_start(w, ev);
    case YAML_SEQUENCE_END_EVENT: return walk_sequence_end(w, ev);
    case YAML_ALIAS_EVENT:
        return walk_fail(w, ev, "aliases are not supported ('*%.64s')",
                         (const char *)ev->data.alias.anchor);
    default: return KVD_OK;
    }
}

/* Runs libyaml over the buffer, collecting keys into w->keys. */
static kvd_status_t yaml_walk(kvd_yaml_walk_t *w, const char *yaml, size_t len)
{
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) {
        snprintf(w->reason, sizeof(w->reason), "out of memory");
        return KVD_ERR_NOMEM;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)yaml, len);
    kvd_status_t st = KVD_OK;
    bool done = false;
    while (st == KVD_OK && !done) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) {
            if (parser.error == YAML_MEMORY_ERROR) {
                snprintf(w->reason, sizeof(w->reason), "out of memory");
                st = KVD_ERR_NOMEM;
            } else {
                w->line = (unsigned)parser.problem_mark.line + 1;
                snprintf(w->reason, sizeof(w->reason), "%s%s%s",
                         parser.problem ? parser.problem : "syntax error",
                         parser.context ? " " : "",
                         parser.context ? parser.context : "");
                st = KVD_ERR_INVALID;
            }
            break;
        }
        done = ev.type == YAML_STREAM_END_EVENT;
        st = walk_event(w, &ev);
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&parser);
    return st;
}

static kvd_status_t config_load(kvd_config_t *config, const char *yaml,
                                size_t len, const char *origin, char *err,
                                size_t err_len)
{
    kvd_yaml_walk_t *w = calloc(1, sizeof(*w));
    if (w == NULL) {
        kvd_config_err(err, err_len, "%s: out of memory", origin);
        return KVD_ERR_NOMEM;
    }
    w->origin = origin;
    kvd_status_t st = yaml_walk(w, yaml, len);
    if (st != KVD_OK) {
        goto err_walk;
    }
    config_lock(config);
    st = list_merge(&config->file, &w->keys);
    config_unlock(config);
    if (st != KVD_OK) {
        snprintf(w->reason, sizeof(w->reason), "out of memory");
        goto err_walk;
    }
    walk_cleanup(w);
    free(w);
    return KVD_OK;

err_walk:
    if (w->line > 0) {
        if (err == NULL || err_len == 0) {
            KVD_LOG_ERROR("config %s:%u: %s", origin, w->line, w->reason);
        }
        kvd_config_err(err, err_len, "%s:%u: %s", origin, w->line, w->reason);
    } else {
        if (err == NULL || err_len == 0) {
            KVD_LOG_ERROR("config %s: %s", origin, w->reason);
        }
        kvd_config_err(err, err_len, "%s: %s", origin, w->reason);
    }
    walk_cleanup(w);
    free(w);
    return st;
}

KVD_API kvd_status_t kvd_config_load_yaml(kvd_config_t *config,
                                          const char *yaml, size_t len,
                                          char *err, size_t err_len)
{
    if (config == NULL || (yaml == NULL && len > 0)) {
        kvd_config_err(err, err_len, "NULL argument");
        return KVD_ERR_INVALID;
    }
    return config_load(config, yaml != NULL ? yaml : "", len, "<yaml>", err,
                       err_len);
}

/* Reads a whole file into a malloc'd buffer. */
static kvd_status_t file_slurp(const char *path, char **buf_out,
                               size_t *len_out, char *err, size_t err_len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        int e = errno;
        kvd_config_err(err, err_len, "%s: %s", path, strerror(e));
        if (err == NULL || err_len == 0) {
            KVD_LOG_ERROR("config %s: %s", path, strerror(e));
        }
        return e == ENOENT || e == ENOTDIR ? KVD_ERR_NOT_FOUND : KVD_ERR_IO;
    }
    kvd_status_t st = KVD_OK;
    size_t len = 0, cap = 4096;
    char *buf = malloc(cap);
    if (buf == NULL) {
        st = KVD_ERR_NOMEM;
        kvd_config_err(err, err_len, "%s: out of memory", path);
        goto err_file;
    }
    for (;;) {
        if (len == cap) {
            if (cap >= KVD_CONFIG_FILE_MAX) {
                st = KVD_ERR_RANGE;
                kvd_config_err(err, err_len, "%s: larger than %u bytes", path,
                               KVD_CONFIG_FILE_MAX);
                goto err_buf;
            }
            char *nbuf = realloc(buf, cap * 2);
            if (nbuf == NULL) {
                st = KVD_ERR_NOMEM;
                kvd_config_err(err, err_len, "%s: out of memory", path);
                goto err_buf;
            }
            buf = nbuf;
            cap *= 2;
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0) {
            break;
        }
    }
    if (ferror(f)) {
        int e = errno;
        st = KVD_ERR_IO;
        kvd_config_err(err, err_len, "%s: read failed: %s", path, strerror(e));
        if (err == NULL || err_len == 0) {
            KVD_LOG_ERROR("config %s: read failed: %s", path, strerror(e));
        }
        goto err_buf;
    }
    fclose(f);
    *buf_out = buf;
    *len_out = len;
    return KVD_OK;

err_buf:
    free(buf);
err_file:
    fclose(f);
    return st;
}

KVD_API kvd_status_t kvd_config_load_file(kvd_config_t *config,
                                          const char *path, char *err,
                                          size_t err_len)
{
    if (config == NULL || path == NULL) {
        kvd_config_err(err, err_len, "NULL argument");
        return KVD_ERR_INVALID;
    }
    char *buf;
    size_t len;
    kvd_status_t st = file_slurp(path, &buf, &len, err, err_len);
    if (st != KVD_OK) {
        return st;
    }
    st = config_load(config, buf, len, path, err, err_len);
    free(buf);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Resolution                                                               */
/* ------------------------------------------------------------------------ */

typedef enum kvd_config_source {
    KVD_CONFIG_FROM_CALL,
    KVD_CONFIG_FROM_ENV,
    KVD_CONFIG_FROM_FILE,
    KVD_CONFIG_FROM_DEFAULT,
    KVD_CONFIG_FROM_NONE /* required field (NULL default) with no value */
} kvd_config_source_t;

static const char *const source_names[] = {"call", "env", "file", "default",
                                           "none"};

typedef struct kvd_config_value {
    const char *text; /* borrowed from config, environ or the table */
    kvd_config_source_t source;
    const kvd_config_entry_t *entry; /* for FROM_FILE */
    char env_name[sizeof(KVD_CONFIG_ENV_PREFIX) + KVD_CONFIG_KEY_MAX];
    char where[KVD_CONFIG_KEY_MAX + 64]; /* "env KVDEPOT_X", "file f:3" */
} kvd_config_value_t;

/* Finds the text that wins for `field`. The caller holds the config lock;
 * the result borrows from the config, so it is only valid under it. */
static kvd_status_t config_resolve(const kvd_config_t *config,
                                   const kvd_config_field_t *field,
                                   kvd_config_value_t *val)
{
    size_t n = strlen(field->name);
    if (n == 0 || n > KVD_CONFIG_KEY_MAX) {
        return KVD_ERR_INTERNAL;
    }
    memcpy(val->env_name, KVD_CONFIG_ENV_PREFIX,
           sizeof(KVD_CONFIG_ENV_PREFIX) - 1);
    char *env = val->env_name + sizeof(KVD_CONFIG_ENV_PREFIX) - 1;
    for (size_t i = 0; i <= n; i++) {
        char c = field->name[i];
        env[i] = c == '.' || c == '-' ? '_' : (char)toupper((unsigned char)c);
    }
    const kvd_config_entry_t *entry;
    const char *text;
    val->entry = NULL;
    if (config != NULL &&
        (entry = list_find(&config->call, field->name)) != NULL) {
        val->text = entry->value;
        val->source = KVD_CONFIG_FROM_CALL;
        snprintf(val->where, sizeof(val->where), "call parameter");
    } else if ((text = getenv(val->env_name)) != NULL && text[0] != '\0') {
        val->text = text;
        val->source = KVD_CONFIG_FROM_ENV;
        snprintf(val->where, sizeof(val->where), "env %s", val->env_name);
    } else if (config != NULL &&
               (entry = list_find(&config->file, field->name)) != NULL) {
        val->text = entry->value;
        val->source = KVD_CONFIG_FROM_FILE;
        val->entry = entry;
        snprintf(val->where, sizeof(val->where), "file %s:%u", entry->origin,
                 entry->line);
    } else if (field->default_value != NULL) {
        val->text = field->default_value;
        val->source = KVD_CONFIG_FROM_DEFAULT;
        snprintf(val->where, sizeof(val->where), "default");
    } else {
        val->text = NULL;
        val->source = KVD_CONFIG_FROM_NONE;
        snprintf(val->where, sizeof(val->where), "nowhere");
    }
    return KVD_OK;
}

static size_t first_part_len(const char *name)
{
    const char *dot = strchr(name, '.');
    return dot != NULL ? (size_t)(dot - name) : strlen(name);
}

static kvd_status_t check_sections(const kvd_config_list_t *list,
                                   const char *source,
                                   const char *const *sections, char *err,
                                   size_t err_len)
{
    for (size_t k = 0; k < list->count; k++) {
        const kvd_config_entry_t *entry = &list->items[k];
        size_t plen = first_part_len(entry->key);
        bool known = false;
        for (size_t i = 0; sections[i] != NULL && !known; i++) {
            known = strlen(sections[i]) == plen &&
                    strncmp(sections[i], entry->key, plen) == 0;
        }
        if (!known) {
            if (entry->origin != NULL) {
                kvd_config_err(err, err_len,
                               "unknown setting '%s' (from %s %s:%u): no "
                               "section '%.*s'",
                               entry->key, source, entry->origin, entry->line,
                               (int)plen, entry->key);
            } else {
                kvd_config_err(err, err_len,
                               "unknown setting '%s' (from %s): no section "
                               "'%.*s'",
                               entry->key, source, (int)plen, entry->key);
            }
            return KVD_ERR_NOT_FOUND;
        }
    }
    return KVD_OK;
}

kvd_status_t kvd_config_check_sections(const kvd_config_t *config,
                                       const char *const *sections, char *err,
                                       size_t err_len)
{
    if (sections == NULL) {
        return KVD_ERR_INVALID;
    }
    if (config == NULL) {
        return KVD_OK;
    }
    config_lock(config);
    kvd_status_t st =
        check_sections(&config->call, "call parameter", sections, err, err_len);
    if (st == KVD_OK) {
        st = check_sections(&config->file, "file", sections, err, err_len);
    }
    config_unlock(config);
    return st;
}

/* Whether `entry` is a member of field `name`'s mapping (or deeper):
 * apply_field answers for those, through the mapping's own entry. */
static bool key_below(const kvd_config_entry_t *entry, const char *name)
{
    size_t n = strlen(name);
    return strncmp(entry->key, name, n) == 0 && entry->key[n] == '.';
}

/* Whether `entry` is a mapping that holds field `name` (a section). */
static bool key_above(const kvd_config_entry_t *entry, const char *name)
{
    size_t n = strlen(entry->key);
    return entry->shape == KVD_CONFIG_SHAPE_MAP &&
           strncmp(entry->key, name, n) == 0 && name[n] == '.';
}

/* A key is checked only when some field shares its first dot-part, so
 * keys meant for other components pass through. */
static kvd_status_t check_unknown(const kvd_config_list_t *list,
                                  const char *source,
                                  const kvd_config_field_t *table,
                                  size_t num_fields, char *err, size_t err_len)
{
    for (size_t k = 0; k < list->count; k++) {
        const kvd_config_entry_t *entry = &list->items[k];
        size_t plen = first_part_len(entry->key);
        bool ours = false;
        bool known = false;
        for (size_t f = 0; f < num_fields && !known; f++) {
            const char *name = table[f].name;
            if (strncmp(name, entry->key, plen) == 0 &&
                (name[plen] == '.' || name[plen] == '\0')) {
                ours = true;
            }
            known = strcmp(name, entry->key) == 0 || key_below(entry, name) ||
                    key_above(entry, name);
        }
        if (ours && !known) {
            if (entry->origin != NULL) {
                kvd_config_err(err, err_len,
                               "unknown setting '%s' (from %s %s:%u)",
                               entry->key, source, entry->origin, entry->line);
            } else {
                kvd_config_err(err, err_len, "unknown setting '%s' (from %s)",
                               entry->key, source);
            }
            if (err == NULL || err_len == 0) {
                KVD_LOG_ERROR("config: unknown setting '%s' (from %s)",
                              entry->key, source);
            }
            return KVD_ERR_NOT_FOUND;
        }
    }
    return KVD_OK;
}

static kvd_status_t check_table(const kvd_config_field_t *table,
                                size_t num_fields, char *err, size_t err_len)
{
    for (size_t f = 0; f < num_fields; f++) {
        if (table[f].name == NULL || table[f].parse == NULL ||
            table[f].name[0] == '\0' ||
            strlen(table[f].name) > KVD_CONFIG_KEY_MAX) {
            kvd_config_err(err, err_len,
                           "config table entry %zu has no name or no parser",
                           f);
            return KVD_ERR_INVALID;
        }
    }
    return KVD_OK;
}

/* Whether what the file gave `field` has the shape it takes: a mapping
 * of scalars for pairs, a sequence (or a scalar) for lists, a scalar
 * (the comma text) for both and for every other field. */
static bool shape_fits(const kvd_config_field_t *field,
                       const kvd_config_entry_t *entry, char *reason,
                       size_t reason_len)
{
    bool pairs = field->parse == kvd_config_parse_pairs;
    bool list = field->parse == kvd_config_parse_list;
    const char *want = pairs  ? "a mapping of scalars (key: value) or "
                                "key=value pairs, comma-separated"
                       : list ? "a list of scalars or a comma-separated "
                                "string"
                              : "a single value";
    if (entry->shape == KVD_CONFIG_SHAPE_MAP && !pairs) {
        kvd_config_err(reason, reason_len, "a mapping where %s is expected",
                       want);
        return false;
    }
    if (entry->shape == KVD_CONFIG_SHAPE_LIST && !list) {
        kvd_config_err(reason, reason_len, "a list where %s is expected", want);
        return false;
    }
    if (entry->shape == KVD_CONFIG_SHAPE_MAP && entry->problem != NULL) {
        kvd_config_err(reason, reason_len, "want %s: %s", want, entry->problem);
        return false;
    }
    return true;
}

static kvd_status_t apply_field(const kvd_config_t *config,
                                const kvd_config_field_t *field, void *settings,
                                char *err, size_t err_len)
{
    char reason[256] = "";
    kvd_config_value_t *val = malloc(sizeof(*val));
    if (val == NULL) {
        kvd_config_err(err, err_len, "%s: out of memory", field->name);
        return KVD_ERR_NOMEM;
    }
    kvd_status_t st = config_resolve(config, field, val);
    if (st != KVD_OK) {
        kvd_config_err(err, err_len, "%s: bad field name", field->name);
        goto out;
    }
    if (val->source == KVD_CONFIG_FROM_NONE) {
        st = KVD_ERR_NOT_FOUND;
        kvd_config_err(err, err_len,
                       "%s: required setting has no value (set it in the call, "
                       "%s or the config file)",
                       field->name, val->env_name);
        if (err == NULL || err_len == 0) {
            KVD_LOG_ERROR("config: %s is required and not set", field->name);
        }
        goto out;
    }
    if (val->source == KVD_CONFIG_FROM_FILE &&
        !shape_fits(field, val->entry, reason, sizeof(reason))) {
        st = KVD_ERR_INVALID;
        kvd_config_err(err, err_len, "%s (from %s): %s", field->name,
                       val->where, reason);
        if (err == NULL || err_len == 0) {
            KVD_LOG_ERROR("config: %s (from %s): %s", field->name, val->where,
                          reason);
        }
        goto out;
    }
    st = field->parse(field, val->text, (char *)settings + field->offset,
                      reason, sizeof(reason));
    if (st == KVD_OK) {
        goto out;
    }
    size_t vlen = strlen(val->text);
    const char *more = vlen > KVD_CONFIG_QUOTE_MAX ? "..." : "";
    if (val->source == KVD_CONFIG_FROM_DEFAULT) {
        /* The table is code: a default that does not parse is our bug. */
        st = KVD_ERR_INTERNAL;
        kvd_config_err(err, err_len, "%s: default '%.*s%s' is invalid: %s",
                       field->name, KVD_CONFIG_QUOTE_MAX, val->text, more,
                       reason);
    } else {
        kvd_config_err(err, err_len, "%s='%.*s%s' (from %s): %s", field->name,
                       KVD_CONFIG_QUOTE_MAX, val->text, more, val->where,
                       reason);
    }
    if (err == NULL || err_len == 0) {
        KVD_LOG_ERROR("config: %s='%.*s%s' (from %s): %s", field->name,
                      KVD_CONFIG_QUOTE_MAX, val->text, more, val->where,
                      reason);
    }
out:
    free(val);
    return st;
}

KVD_API kvd_status_t kvd_config_apply(const kvd_config_t *config,
                                      const kvd_config_field_t *table,
                                      size_t num_fields, void *settings,
                                      char *err, size_t err_len)
{
    if ((table == NULL && num_fields > 0) || settings == NULL) {
        kvd_config_err(err, err_len, "NULL argument");
        return KVD_ERR_INVALID;
    }
    kvd_status_t st = check_table(table, num_fields, err, err_len);
    if (st != KVD_OK) {
        return st;
    }
    config_lock(config);
    if (config != NULL) {
        st = check_unknown(&config->call, "call parameter", table, num_fields,
                           err, err_len);
        if (st == KVD_OK) {
            st = check_unknown(&config->file, "file", table, num_fields, err,
                               err_len);
        }
    }
    for (size_t f = 0; f < num_fields && st == KVD_OK; f++) {
        st = apply_field(config, &table[f], settings, err, err_len);
    }
    config_unlock(config);
    return st;
}

KVD_API kvd_status_t kvd_config_visit(const kvd_config_t *config,
                                      const kvd_config_field_t *table,
                                      size_t num_fields, kvd_config_visit_fn fn,
                                      void *ctx)
{
    if ((table == NULL && num_fields > 0) || fn == NULL ||
        check_table(table, num_fields, NULL, 0) != KVD_OK) {
        return KVD_ERR_INVALID;
    }
    kvd_config_value_t *val = malloc(sizeof(*val));
    if (val == NULL) {
        return KVD_ERR_NOMEM;
    }
    kvd_status_t st = KVD_OK;
    config_lock(config);
    for (size_t f = 0; f < num_fields && st == KVD_OK; f++) {
        st = config_resolve(config, &table[f], val);
        if (st == KVD_OK) {
            st = fn(ctx, &table[f], val->text != NULL ? val->text : "",
                    source_names[val->source]);
        }
    }
    config_unlock(config);
    free(val);
    return st;
}

static kvd_status_t config_print_one(void *ctx, const kvd_config_field_t *field,
                                     const char *value, const char *source)
{
    FILE *out = ctx;
    /* Lists and pairs print canonical, however they were written. */
    char canon[KVD_CONFIG_STRING_MAX];
    if ((field->parse == kvd_config_parse_pairs ||
         field->parse == kvd_config_parse_list) &&
        field->parse(field, value, canon, NULL, 0) == KVD_OK) {
        value = canon;
    }
    if (fprintf(out, "%s = %s  # %s (default: %s, from: %s)\n", field->name,
                value, field->doc != NULL ? field->doc : "",
                field->default_value != NULL ? field->default_value : "none",
                source) < 0) {
        return KVD_ERR_IO;
    }
    return KVD_OK;
}

KVD_API kvd_status_t kvd_config_print(const kvd_config_t *config,
                                      const kvd_config_field_t *table,
                                      size_t num_fields, FILE *out)
{
    if (out == NULL) {
        return KVD_ERR_INVALID;
    }
    return kvd_config_visit(config, table, num_fields, config_print_one, out);
}
