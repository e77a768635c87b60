/*
 * The hash table every part of _token_hash shares: a dictionary of distinct tokens (byte
 * strings) in first-seen order, with open addressing. split.c fills one per block of text,
 * tables.c keeps one per TokenIndex or TokenCounts.
 *
 * Lookups are pipelined: a token is first hashed and its slot prefetched (pending_token), and
 * looked up PREFETCH_DISTANCE tokens later (dictionary_lookup, lookup_strings). The tables are
 * megabytes, so the slot loads miss the cache for all but the commonest tokens; having several
 * in flight overlaps those misses instead of waiting for each.
 */
#ifndef ELMO_TOKEN_HASH_DICTIONARY_H
#define ELMO_TOKEN_HASH_DICTIONARY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* --- growable arrays -------------------------------------------------------------------- */

typedef struct {
    char *data;
    size_t size;     /* bytes used */
    size_t capacity; /* bytes allocated */
} Buffer;

int buffer_reserve(Buffer *buf, size_t extra);

static inline int buffer_push(Buffer *buf, const void *item, size_t size) {
    if (buf->size + size > buf->capacity && buffer_reserve(buf, size) < 0) {
        return -1;
    }
    memcpy(buf->data + buf->size, item, size);
    buf->size += size;
    return 0;
}

/* --- the dictionary ---------------------------------------------------------------------- */

typedef struct {
    uint64_t head;  /* the entry's first 8 bytes: a token of up to 8 bytes is matched here */
    int32_t length; /* of the entry */
    int32_t id;     /* dictionary entry, -1: empty */
} Slot;

typedef struct {
    uint64_t head; /* the token's first 8 bytes, zero-padded: short tokens compare in one go */
    int32_t start; /* in the dictionary's bytes */
    int32_t length;
} Entry;

typedef struct {
    Slot *slots;
    size_t mask;    /* capacity - 1, capacity a power of two */
    Buffer entries; /* Entry[D] */
    Buffer data;    /* the entries' bytes, concatenated */
    int32_t size;
} Dictionary;

enum { NOT_FOUND = -1, OUT_OF_MEMORY = -2 }; /* OUT_OF_MEMORY: also past 2 GiB of token bytes */

int dictionary_init(Dictionary *dict, size_t capacity); /* capacity: a power of two */
void dictionary_free(Dictionary *dict);

/* The first min(len, 8) bytes of s, zero-padded (s + len <= end). */
static inline uint64_t load_head(const unsigned char *s, Py_ssize_t len, const unsigned char *end) {
    uint64_t word = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (len > 0 && end - s >= 8) { /* one unaligned load, masked: no short copy */
        memcpy(&word, s, 8);
        return len >= 8 ? word : word & ((~0ULL) >> (8 * (8 - len)));
    }
#endif
    memcpy(&word, s, (size_t)(len < 8 ? len : 8));
    return word;
}

static inline uint64_t hash_token(const unsigned char *s, Py_ssize_t len, uint64_t head,
                                  const unsigned char *end) {
    uint64_t h = (head ^ (uint64_t)len) * 0xBF58476D1CE4E5B9ULL;
    for (Py_ssize_t at = 8; at < len; at += 8) {
        h ^= h >> 29;
        h = (h ^ load_head(s + at, len - at, end)) * 0x94D049BB133111EBULL;
    }
    h ^= h >> 31;
    h *= 0xD6E8FEB86659FD93ULL;
    return h ^ (h >> 32);
}

/* A token on its way to the dictionary: hashed, its slot prefetched. */
typedef struct {
    const unsigned char *token;
    Py_ssize_t length;
    uint64_t head, hash;
} Pending;

enum { PREFETCH_DISTANCE = 8 };

static inline Pending pending_token(const Dictionary *dict, const unsigned char *token,
                                    Py_ssize_t len, const unsigned char *end) {
    uint64_t head = load_head(token, len, end);
    uint64_t h = hash_token(token, len, head, end);
#if defined(__GNUC__)
    __builtin_prefetch(&dict->slots[(size_t)h & dict->mask]);
#endif
    return (Pending){token, len, head, h};
}

/* The token's entry; when absent, added if `insert`, else NOT_FOUND; OUT_OF_MEMORY on failure. */
int32_t dictionary_lookup(Dictionary *dict, const Pending *pending, int insert);

/* The int32[D+1] offsets of the entries in the dictionary's bytes, as a bytes object. */
PyObject *dictionary_offsets(const Dictionary *dict);

/* --- strings as Arrow holds them --------------------------------------------------------- */

/* int32 offsets[n+1] (absolute, from any start) into data. */
typedef struct {
    Py_buffer offsets, data;
    Py_ssize_t count;
} Strings;

/* Check parsed buffers (released on failure); 0, or -1 with an exception set. */
int strings_check(Strings *out);
/* Parse two buffer arguments (format "y*y*:name") and check them. */
int strings_get(PyObject *args, const char *format, Strings *out);
void strings_release(Strings *strings);

/* out[i]: the entry of string i (added when absent if `insert`, else NOT_FOUND), in order, each
 * slot prefetched PREFETCH_DISTANCE strings ahead. Strings whose `weights` entry is 0 are
 * skipped (NOT_FOUND) when weights is given. 0, or OUT_OF_MEMORY. */
int lookup_strings(Dictionary *dict, const Strings *strings, const int64_t *weights, int insert,
                   int32_t *out);

#endif
