/*
 * Hashing tokens in C, for `elmo prepare`.
 *
 * split_and_encode: one pass over a block of UTF-8 text that splits it on whitespace as Python's
 * str.split() does and dictionary-encodes the tokens (first-occurrence order, as Arrow's
 * dictionary_encode).
 * TokenIndex: the word-type table's tokens hashed once per process, so that each block's
 * dictionary finds its type ids with one probe per distinct token.
 *
 * Why C: tokenizing with NumPy (masks, nonzero, compress) and then hashing every token with
 * Arrow walks the bytes about ten times and was half of `elmo prepare`'s time; here each byte
 * is read once and each token hashed as it ends. Arrow's index_in re-hashed a block's
 * dictionary and probed it with every type, per block. The NumPy/Arrow paths
 * (whitespace_block.py, shards.py) stay as the fallback when this module is not built, and the
 * tests check both agree.
 *
 * split_and_encode(block) -> (ids, line_offsets, dict_offsets, dict_data), all bytes:
 *   ids           int32[N]    each token's entry in the block's dictionary
 *   line_offsets  int64[L+1]  line i's tokens are ids[o[i]:o[i+1]]; lines end at '\n' (a block
 *                             not ending with '\n' has one more line)
 *   dict_offsets  int32[D+1]  entry j is dict_data[o[j]:o[j+1]]
 *   dict_data     the distinct tokens' bytes
 * Any bytes are split safely (reads are bounds-checked) and a multi-byte space is matched only
 * in full, so the caller can check UTF-8 on the distinct tokens alone (whitespace_block.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* --- growable arrays -------------------------------------------------------------------- */

typedef struct {
    char *data;
    size_t size;     /* bytes used */
    size_t capacity; /* bytes allocated */
} Buffer;

static int buffer_reserve(Buffer *buf, size_t extra) {
    if (buf->size + extra <= buf->capacity) {
        return 0;
    }
    size_t capacity = buf->capacity ? buf->capacity : 4096;
    while (capacity < buf->size + extra) {
        capacity *= 2;
    }
    char *data = realloc(buf->data, capacity);
    if (data == NULL) {
        return -1;
    }
    buf->data = data;
    buf->capacity = capacity;
    return 0;
}

static inline int buffer_push(Buffer *buf, const void *item, size_t size) {
    if (buf->size + size > buf->capacity && buffer_reserve(buf, size) < 0) {
        return -1;
    }
    memcpy(buf->data + buf->size, item, size);
    buf->size += size;
    return 0;
}

/* --- whitespace, as str.isspace() ------------------------------------------------------- */

/* 1: an ASCII space (\t \n \v \f \r, the separators 0x1c-0x1f, ' '); 2: the lead byte of a
 * multi-byte space (U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F,
 * U+3000); 0: never the start of a space. */
static unsigned char space_class[256];

static void init_space_class(void) {
    const unsigned char ascii[] = {9, 10, 11, 12, 13, 28, 29, 30, 31, 32};
    for (size_t i = 0; i < sizeof ascii; i++) {
        space_class[ascii[i]] = 1;
    }
    space_class[0xC2] = space_class[0xE1] = space_class[0xE2] = space_class[0xE3] = 2;
}

/* Length in bytes of the space starting at p[i], or 0 if p[i] does not start one. */
static inline Py_ssize_t space_length(const unsigned char *p, Py_ssize_t i, Py_ssize_t n) {
    unsigned char kind = space_class[p[i]];
    if (kind != 2) {
        return kind;
    }
    unsigned char b1 = i + 1 < n ? p[i + 1] : 0;
    unsigned char b2 = i + 2 < n ? p[i + 2] : 0;
    switch (p[i]) {
    case 0xC2:
        return (b1 == 0x85 || b1 == 0xA0) ? 2 : 0;
    case 0xE1:
        return (b1 == 0x9A && b2 == 0x80) ? 3 : 0;
    case 0xE2:
        if (b1 == 0x80) {
            return (b2 <= 0x8A || b2 == 0xA8 || b2 == 0xA9 || b2 == 0xAF) && b2 >= 0x80 ? 3 : 0;
        }
        return (b1 == 0x81 && b2 == 0x9F) ? 3 : 0;
    default: /* 0xE3 */
        return (b1 == 0x80 && b2 == 0x80) ? 3 : 0;
    }
}

/* --- 64 bytes at a time: where the separators are ------------------------------------- */

/* Bit j of each mask describes q[j]: `space` an ASCII space, `newline` a '\n', `lead` the lead
 * byte of a possible multi-byte space (checked by space_length, as they are rare). */
typedef struct {
    uint64_t space, newline, lead;
} ChunkMasks;

#if defined(__SSE2__)
/* 0xFF in each byte of x within [lo, hi] (unsigned). */
static inline __m128i bytes_within(__m128i x, char lo, char hi) {
    __m128i clamped = _mm_min_epu8(_mm_max_epu8(x, _mm_set1_epi8(lo)), _mm_set1_epi8(hi));
    return _mm_cmpeq_epi8(clamped, x);
}

static inline ChunkMasks chunk_masks(const unsigned char *q) {
    ChunkMasks masks = {0, 0, 0};
    for (int part = 0; part < 4; part++) {
        __m128i x = _mm_loadu_si128((const __m128i *)(q + 16 * part));
        __m128i space = _mm_or_si128(bytes_within(x, 9, 13), bytes_within(x, 28, 32));
        __m128i newline = _mm_cmpeq_epi8(x, _mm_set1_epi8('\n'));
        __m128i lead = _mm_or_si128(_mm_cmpeq_epi8(x, _mm_set1_epi8((char)0xC2)),
                                    bytes_within(x, (char)0xE1, (char)0xE3));
        masks.space |= (uint64_t)(uint16_t)_mm_movemask_epi8(space) << (16 * part);
        masks.newline |= (uint64_t)(uint16_t)_mm_movemask_epi8(newline) << (16 * part);
        masks.lead |= (uint64_t)(uint16_t)_mm_movemask_epi8(lead) << (16 * part);
    }
    return masks;
}
#else
static inline ChunkMasks chunk_masks(const unsigned char *q) {
    ChunkMasks masks = {0, 0, 0};
    for (int j = 0; j < 64; j++) {
        masks.space |= (uint64_t)(space_class[q[j]] == 1) << j;
        masks.newline |= (uint64_t)(q[j] == '\n') << j;
        masks.lead |= (uint64_t)(space_class[q[j]] == 2) << j;
    }
    return masks;
}
#endif

static inline int lowest_bit(uint64_t mask) {
#if defined(__GNUC__)
    return __builtin_ctzll(mask);
#else
    int bit = 0;
    while (!(mask & 1)) {
        mask >>= 1;
        bit++;
    }
    return bit;
#endif
}

/* --- the dictionary: open addressing over the distinct tokens ---------------------------- */

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
    size_t mask;     /* capacity - 1, capacity a power of two */
    Buffer entries;  /* Entry[D] */
    Buffer data;     /* the entries' bytes, concatenated */
    int32_t size;
} Dictionary;

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

static int dictionary_init(Dictionary *dict, size_t capacity) {
    memset(dict, 0, sizeof *dict);
    dict->slots = malloc(capacity * sizeof(Slot));
    if (dict->slots == NULL) {
        return -1;
    }
    memset(dict->slots, 0xFF, capacity * sizeof(Slot)); /* id -1 everywhere */
    dict->mask = capacity - 1;
    return 0;
}

static void dictionary_free(Dictionary *dict) {
    free(dict->slots);
    free(dict->entries.data);
    free(dict->data.data);
}

static inline Entry *dictionary_entries(const Dictionary *dict) {
    return (Entry *)dict->entries.data;
}

/* Double the table; each entry's hash is recomputed from its bytes. */
static int dictionary_grow(Dictionary *dict) {
    size_t capacity = 2 * (dict->mask + 1);
    Slot *slots = malloc(capacity * sizeof(Slot));
    if (slots == NULL) {
        return -1;
    }
    memset(slots, 0xFF, capacity * sizeof(Slot));
    const Entry *entries = dictionary_entries(dict);
    const unsigned char *bytes = (const unsigned char *)dict->data.data;
    const unsigned char *end = bytes + dict->data.size;
    for (int32_t id = 0; id < dict->size; id++) {
        const Entry *entry = &entries[id];
        uint64_t h = hash_token(bytes + entry->start, entry->length, entry->head, end);
        size_t at = (size_t)h & (capacity - 1);
        while (slots[at].id >= 0) {
            at = (at + 1) & (capacity - 1);
        }
        slots[at] = (Slot){entry->head, entry->length, id};
    }
    free(dict->slots);
    dict->slots = slots;
    dict->mask = capacity - 1;
    return 0;
}

enum { NOT_FOUND = -1, OUT_OF_MEMORY = -2 };

/* A token on its way to the dictionary: hashed, its slot prefetched, looked up a few tokens
 * later. The slot loads miss the cache for all but the commonest tokens (the table is MBs), and
 * PREFETCH_DISTANCE tokens in flight overlap those misses instead of waiting for each. */
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
static int32_t dictionary_lookup(Dictionary *dict, const Pending *pending, int insert) {
    const unsigned char *token = pending->token;
    Py_ssize_t len = pending->length;
    uint64_t head = pending->head;
    size_t at = (size_t)pending->hash & dict->mask;
    for (;;) {
        Slot slot = dict->slots[at];
        if (slot.id < 0) {
            break;
        }
        if (slot.head == head && slot.length == len &&
            (len <= 8 || memcmp(dict->data.data + dictionary_entries(dict)[slot.id].start + 8,
                                token + 8, (size_t)len - 8) == 0)) {
            return slot.id;
        }
        at = (at + 1) & dict->mask;
    }
    if (!insert) {
        return NOT_FOUND;
    }
    Entry entry = {head, (int32_t)dict->data.size, (int32_t)len};
    if (buffer_push(&dict->data, token, (size_t)len) < 0 ||
        buffer_push(&dict->entries, &entry, sizeof entry) < 0) {
        return OUT_OF_MEMORY;
    }
    int32_t id = dict->size++;
    dict->slots[at] = (Slot){head, (int32_t)len, id};
    if ((size_t)dict->size * 2 > dict->mask + 1 && dictionary_grow(dict) < 0) {
        return OUT_OF_MEMORY;
    }
    return id;
}

/* The int32[D+1] offsets of the entries in the dictionary's bytes. */
static PyObject *dictionary_offsets(const Dictionary *dict) {
    PyObject *offsets = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(dict->size + 1) * 4);
    if (offsets == NULL) {
        return NULL;
    }
    int32_t *out = (int32_t *)PyBytes_AS_STRING(offsets);
    const Entry *entries = dictionary_entries(dict);
    out[0] = 0;
    for (int32_t id = 0; id < dict->size; id++) {
        out[id + 1] = entries[id].start + entries[id].length;
    }
    return offsets;
}

/* --- the pass ----------------------------------------------------------------------------- */

/* The tokens of a block on their way into the dictionary and the ids. Each token is looked up
 * PREFETCH_DISTANCE tokens after it is found (in order, so ids stay first-occurrence ids). */
typedef struct {
    Dictionary *dict;
    Buffer *ids;
    const unsigned char *end;
    Pending ring[PREFETCH_DISTANCE];
    int64_t found; /* tokens found; those before found - PREFETCH_DISTANCE have their ids */
} Encoder;

static inline int encoder_resolve(Encoder *encoder, int64_t k) {
    int32_t id = dictionary_lookup(encoder->dict, &encoder->ring[k % PREFETCH_DISTANCE], 1);
    if (id < 0) {
        return -1;
    }
    ((int32_t *)encoder->ids->data)[k] = id;
    return 0;
}

static inline int encoder_add(Encoder *encoder, const unsigned char *token, Py_ssize_t len) {
    if (buffer_reserve(encoder->ids, sizeof(int32_t)) < 0) {
        return -1;
    }
    if (encoder->found >= PREFETCH_DISTANCE &&
        encoder_resolve(encoder, encoder->found - PREFETCH_DISTANCE) < 0) {
        return -1;
    }
    encoder->ring[encoder->found % PREFETCH_DISTANCE] =
        pending_token(encoder->dict, token, len, encoder->end);
    encoder->found++;
    encoder->ids->size += sizeof(int32_t);
    return 0;
}

static int encoder_finish(Encoder *encoder) {
    int64_t k = encoder->found > PREFETCH_DISTANCE ? encoder->found - PREFETCH_DISTANCE : 0;
    for (; k < encoder->found; k++) {
        if (encoder_resolve(encoder, k) < 0) {
            return -1;
        }
    }
    return 0;
}

/* Split and encode p[0:n]; 0, or -1 when out of memory. A chunk of 64 bytes at a time: its
 * separator mask gives the token starts (a word byte after a separator) and stops (the
 * reverse), visited in order with the newlines; the last chunk is padded with ' '. */
static int split_block(const unsigned char *p, Py_ssize_t n, Buffer *ids, Buffer *lines,
                       Dictionary *dict) {
    Encoder encoder = {.dict = dict, .ids = ids, .end = p + n, .found = 0};
    if (buffer_push(lines, &encoder.found, sizeof encoder.found) < 0) {
        return -1;
    }
    Py_ssize_t start = -1;  /* of the token in progress; -1 between tokens */
    uint64_t overhang = 0;  /* bytes of a multi-byte space that began in the previous chunk */
    for (Py_ssize_t base = 0; base < n; base += 64) {
        unsigned char padded[64];
        const unsigned char *q = p + base;
        if (n - base < 64) {
            memcpy(padded, q, (size_t)(n - base));
            memset(padded + (n - base), ' ', (size_t)(64 - (n - base)));
            q = padded;
        }
        ChunkMasks masks = chunk_masks(q);
        uint64_t separator = masks.space | overhang;
        overhang = 0;
        for (uint64_t leads = masks.lead; leads; leads &= leads - 1) {
            int k = lowest_bit(leads);
            Py_ssize_t len = space_length(p, base + k, n);
            if (len) {
                uint64_t bytes = (1ULL << len) - 1;
                separator |= bytes << k;
                if (k + len > 64) {
                    overhang = bytes >> (64 - k);
                }
            }
        }
        uint64_t after_separator = (separator << 1) | (start < 0);
        uint64_t starts = ~separator & after_separator, stops = separator & ~after_separator;
        for (uint64_t events = starts | stops | masks.newline; events; events &= events - 1) {
            int k = lowest_bit(events);
            uint64_t bit = 1ULL << k;
            if (starts & bit) {
                start = base + k;
                continue;
            }
            if (stops & bit) {
                if (encoder_add(&encoder, p + start, base + k - start) < 0) {
                    return -1;
                }
                start = -1;
            }
            if ((masks.newline & bit) &&
                buffer_push(lines, &encoder.found, sizeof encoder.found) < 0) {
                return -1;
            }
        }
    }
    if ((start >= 0 && encoder_add(&encoder, p + start, n - start) < 0) ||
        encoder_finish(&encoder) < 0) {
        return -1;
    }
    if (n == 0 || p[n - 1] != '\n') {
        return buffer_push(lines, &encoder.found, sizeof encoder.found);
    }
    return 0;
}

static PyObject *split_and_encode(PyObject *module, PyObject *args) {
    Py_buffer block;
    if (!PyArg_ParseTuple(args, "y*:split_and_encode", &block)) {
        return NULL;
    }
    if (block.len >= INT32_MAX) {
        PyBuffer_Release(&block);
        PyErr_SetString(PyExc_ValueError, "block too large for int32 dictionary offsets");
        return NULL;
    }
    Buffer ids = {0}, lines = {0};
    Dictionary dict;
    int status = dictionary_init(&dict, 1 << 16);
    if (status == 0) {
        status = buffer_reserve(&ids, (size_t)block.len + 16); /* ~4 bytes per 5 of text */
    }
    if (status == 0) {
        Py_BEGIN_ALLOW_THREADS
        status = split_block(block.buf, block.len, &ids, &lines, &dict);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&block);
    PyObject *result = NULL;
    if (status < 0) {
        PyErr_NoMemory();
    } else {
        PyObject *offsets = dictionary_offsets(&dict);
        if (offsets != NULL) {
            result = Py_BuildValue("(y#y#Ny#)", ids.data ? ids.data : "", (Py_ssize_t)ids.size,
                                   lines.data, (Py_ssize_t)lines.size, offsets,
                                   dict.data.data ? dict.data.data : "",
                                   (Py_ssize_t)dict.data.size);
        }
    }
    free(ids.data);
    free(lines.data);
    dictionary_free(&dict);
    return result;
}

/* --- TokenIndex: the positions of a fixed list of distinct tokens ------------------------ */

typedef struct {
    PyObject_HEAD Dictionary dict; /* entry id = position in the list */
} TokenIndex;

/* Strings as Arrow holds them: int32 offsets[n+1] (absolute, from any start) into data. */
typedef struct {
    Py_buffer offsets, data;
    Py_ssize_t count;
} Strings;

/* Check parsed buffers (released on failure); 0, or -1 with an exception set. */
static int strings_check(Strings *out) {
    const int32_t *offsets = out->offsets.buf;
    out->count = out->offsets.len / 4 - 1;
    int valid = out->offsets.len % 4 == 0 && out->count >= 0 && offsets[0] >= 0 &&
                offsets[out->count] <= out->data.len;
    for (Py_ssize_t i = 0; valid && i < out->count; i++) {
        valid = offsets[i] <= offsets[i + 1];
    }
    if (!valid) {
        PyBuffer_Release(&out->offsets);
        PyBuffer_Release(&out->data);
        PyErr_SetString(PyExc_ValueError, "offsets must be int32[n+1], rising, within the data");
        return -1;
    }
    return 0;
}

static int strings_get(PyObject *args, const char *format, Strings *out) {
    if (!PyArg_ParseTuple(args, format, &out->offsets, &out->data)) {
        return -1;
    }
    return strings_check(out);
}

static void strings_release(Strings *strings) {
    PyBuffer_Release(&strings->offsets);
    PyBuffer_Release(&strings->data);
}

/* out[i]: the entry of string i (added when absent if `insert`, else NOT_FOUND), in order, each
 * slot prefetched PREFETCH_DISTANCE strings ahead. Strings whose `weights` entry is 0 are
 * skipped (NOT_FOUND) when weights is given. 0, or OUT_OF_MEMORY. */
static int lookup_strings(Dictionary *dict, const Strings *strings, const int64_t *weights,
                          int insert, int32_t *out) {
    const int32_t *offsets = strings->offsets.buf;
    const unsigned char *data = strings->data.buf, *end = data + strings->data.len;
    Pending ring[PREFETCH_DISTANCE];
    Py_ssize_t position[PREFETCH_DISTANCE];
    int64_t queued = 0;
    for (Py_ssize_t i = 0; i <= strings->count; i++) {
        int last = i == strings->count;
        if (!last && weights != NULL && weights[i] == 0) {
            out[i] = NOT_FOUND;
            continue;
        }
        /* the oldest queued lookup, or at the end all that remain */
        int64_t from = queued - PREFETCH_DISTANCE, to = last ? queued : from + 1;
        for (int64_t k = from < 0 ? 0 : from; k < to; k++) {
            int32_t id = dictionary_lookup(dict, &ring[k % PREFETCH_DISTANCE], insert);
            if (id == OUT_OF_MEMORY) {
                return OUT_OF_MEMORY;
            }
            out[position[k % PREFETCH_DISTANCE]] = id;
        }
        if (!last) {
            Py_ssize_t len = offsets[i + 1] - offsets[i];
            ring[queued % PREFETCH_DISTANCE] = pending_token(dict, data + offsets[i], len, end);
            position[queued % PREFETCH_DISTANCE] = i;
            queued++;
        }
    }
    return 0;
}

static int token_index_init(TokenIndex *self, PyObject *args, PyObject *kwargs) {
    Strings tokens;
    if (kwargs != NULL && PyDict_Size(kwargs) > 0) {
        PyErr_SetString(PyExc_TypeError, "TokenIndex(offsets, data) takes no keywords");
        return -1;
    }
    if (strings_get(args, "y*y*:TokenIndex", &tokens) < 0) {
        return -1;
    }
    size_t capacity = 16;
    while (capacity < 2 * (size_t)tokens.count + 2) {
        capacity *= 2;
    }
    dictionary_free(&self->dict);
    int32_t status = dictionary_init(&self->dict, capacity) < 0 ? OUT_OF_MEMORY : 0;
    const int32_t *offsets = tokens.offsets.buf;
    const unsigned char *data = tokens.data.buf, *end = data + tokens.data.len;
    for (Py_ssize_t i = 0; status >= 0 && i < tokens.count; i++) {
        Py_ssize_t len = offsets[i + 1] - offsets[i];
        Pending pending = pending_token(&self->dict, data + offsets[i], len, end);
        status = dictionary_lookup(&self->dict, &pending, 1);
        if (status >= 0 && status != i) {
            PyErr_Format(PyExc_ValueError, "token %zd repeats token %d", i, (int)status);
            status = NOT_FOUND;
        }
    }
    strings_release(&tokens);
    if (status == OUT_OF_MEMORY) {
        PyErr_NoMemory();
    }
    return status < 0 ? -1 : 0;
}

static PyObject *token_index_find(TokenIndex *self, PyObject *args) {
    Strings query;
    if (strings_get(args, "y*y*:find", &query) < 0) {
        return NULL;
    }
    PyObject *result = PyBytes_FromStringAndSize(NULL, query.count * 4);
    if (result != NULL) {
        int32_t *out = (int32_t *)PyBytes_AS_STRING(result);
        Py_BEGIN_ALLOW_THREADS
        lookup_strings(&self->dict, &query, NULL, 0, out); /* allocates nothing: cannot fail */
        Py_END_ALLOW_THREADS
    }
    strings_release(&query);
    return result;
}

static void token_index_dealloc(TokenIndex *self) {
    dictionary_free(&self->dict);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef token_index_methods[] = {
    {"find", (PyCFunction)token_index_find, METH_VARARGS,
     "find(offsets, data) -> bytes: int32 position of each token in the index, -1 if absent."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject TokenIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "elmo_core.text._token_hash.TokenIndex",
    .tp_basicsize = sizeof(TokenIndex),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "TokenIndex(offsets, data): a hash of distinct tokens (Arrow string buffers), "
              "built once and probed with find().",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)token_index_init,
    .tp_dealloc = (destructor)token_index_dealloc,
    .tp_methods = token_index_methods,
};

/* --- TokenCounts: occurrences of distinct tokens, summed as they arrive ------------------- */

typedef struct {
    PyObject_HEAD Dictionary dict; /* entries in first-seen order */
    Buffer counts;                 /* int64[entries x columns] */
    int columns;
} TokenCounts;

static int token_counts_init(TokenCounts *self, PyObject *args, PyObject *kwargs) {
    int columns;
    if (kwargs != NULL && PyDict_Size(kwargs) > 0) {
        PyErr_SetString(PyExc_TypeError, "TokenCounts(columns) takes no keywords");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "i:TokenCounts", &columns)) {
        return -1;
    }
    if (columns < 1) {
        PyErr_SetString(PyExc_ValueError, "TokenCounts needs at least one column");
        return -1;
    }
    dictionary_free(&self->dict);
    free(self->counts.data);
    self->counts = (Buffer){0};
    self->columns = columns;
    if (dictionary_init(&self->dict, 1 << 16) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Add counts[i] to token i's entry in `column`; tokens counted 0 are not added. */
static int token_counts_accumulate(TokenCounts *self, const Strings *tokens, const int64_t *counts,
                                   int column) {
    int32_t *ids = malloc((size_t)(tokens->count ? tokens->count : 1) * sizeof(int32_t));
    if (ids == NULL || lookup_strings(&self->dict, tokens, counts, 1, ids) < 0) {
        free(ids);
        return OUT_OF_MEMORY;
    }
    size_t size = (size_t)self->dict.size * self->columns * sizeof(int64_t);
    if (size > self->counts.size) { /* zeros for the new entries */
        if (buffer_reserve(&self->counts, size - self->counts.size) < 0) {
            free(ids);
            return OUT_OF_MEMORY;
        }
        memset(self->counts.data + self->counts.size, 0, size - self->counts.size);
        self->counts.size = size;
    }
    int64_t *totals = (int64_t *)self->counts.data;
    for (Py_ssize_t i = 0; i < tokens->count; i++) {
        if (ids[i] >= 0) {
            totals[(size_t)ids[i] * self->columns + column] += counts[i];
        }
    }
    free(ids);
    return 0;
}

static PyObject *token_counts_add(TokenCounts *self, PyObject *args) {
    Strings tokens;
    Py_buffer counts;
    int column;
    if (!PyArg_ParseTuple(args, "y*y*y*i:add", &tokens.offsets, &tokens.data, &counts, &column)) {
        return NULL;
    }
    if (strings_check(&tokens) < 0) {
        PyBuffer_Release(&counts);
        return NULL;
    }
    PyObject *result = NULL;
    if (counts.len != tokens.count * 8 || column < 0 || column >= self->columns) {
        PyErr_SetString(PyExc_ValueError, "add wants one int64 count per token and a column");
    } else {
        int status;
        Py_BEGIN_ALLOW_THREADS
        status = token_counts_accumulate(self, &tokens, counts.buf, column);
        Py_END_ALLOW_THREADS
        if (status < 0) {
            PyErr_NoMemory();
        } else {
            result = Py_NewRef(Py_None);
        }
    }
    strings_release(&tokens);
    PyBuffer_Release(&counts);
    return result;
}

static PyObject *token_counts_tokens(TokenCounts *self, PyObject *unused) {
    PyObject *offsets = dictionary_offsets(&self->dict);
    if (offsets == NULL) {
        return NULL;
    }
    return Py_BuildValue("(Ny#)", offsets, self->dict.data.data ? self->dict.data.data : "",
                         (Py_ssize_t)self->dict.data.size);
}

static PyObject *token_counts_counts(TokenCounts *self, PyObject *unused) {
    return PyBytes_FromStringAndSize(self->counts.data ? self->counts.data : "",
                                     (Py_ssize_t)self->counts.size);
}

static void token_counts_dealloc(TokenCounts *self) {
    dictionary_free(&self->dict);
    free(self->counts.data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef token_counts_methods[] = {
    {"add", (PyCFunction)token_counts_add, METH_VARARGS,
     "add(offsets, data, counts, column): add int64 counts[i] to token i's entry in column "
     "(tokens distinct, as Arrow string buffers); tokens counted 0 are not added."},
    {"tokens", (PyCFunction)token_counts_tokens, METH_NOARGS,
     "tokens() -> (offsets, data): the distinct tokens, first seen first, as Arrow buffers."},
    {"counts", (PyCFunction)token_counts_counts, METH_NOARGS,
     "counts() -> bytes: int64[tokens x columns], row-major."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject TokenCountsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "elmo_core.text._token_hash.TokenCounts",
    .tp_basicsize = sizeof(TokenCounts),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "TokenCounts(columns): int64 counts of distinct tokens in `columns` columns, "
              "summed by add() in one hash table.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)token_counts_init,
    .tp_dealloc = (destructor)token_counts_dealloc,
    .tp_methods = token_counts_methods,
};

/* --- the module --------------------------------------------------------------------------- */

static PyMethodDef methods[] = {
    {"split_and_encode", split_and_encode, METH_VARARGS,
     "split_and_encode(block) -> (ids, line_offsets, dict_offsets, dict_data): split UTF-8 "
     "bytes on whitespace as str.split() and dictionary-encode the tokens, in one pass."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_token_hash",
    "Hashing tokens in C: whitespace splitting with dictionary encoding, a token index, and "
    "token counts.",
    -1, methods,
};

PyMODINIT_FUNC PyInit__token_hash(void) {
    init_space_class();
    if (PyType_Ready(&TokenIndexType) < 0 || PyType_Ready(&TokenCountsType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(module, "TokenIndex", (PyObject *)&TokenIndexType) < 0 ||
        PyModule_AddObjectRef(module, "TokenCounts", (PyObject *)&TokenCountsType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
