/*
 * Splitting a block of text into dictionary-encoded tokens, for `elmo prepare`.
 *
 * split_and_encode: one pass over a block of UTF-8 text that splits it on whitespace as Python's
 * str.split() does and dictionary-encodes the tokens (first-occurrence order, as Arrow's
 * dictionary_encode).
 *
 * Why C: tokenizing with NumPy (masks, nonzero, compress) and then hashing every token with
 * Arrow walks the bytes about ten times and was half of `elmo prepare`'s time; here the
 * separators of 64 bytes are found at once and each token is hashed as it ends. The NumPy/Arrow
 * path (whitespace_block.py) stays as the fallback when this module is not built, and the tests
 * check both agree.
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
#include "token_hash.h"
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* --- whitespace, as str.isspace() ------------------------------------------------------- */

/* 1: an ASCII space (\t \n \v \f \r, the separators 0x1c-0x1f, ' '); 2: the lead byte of a
 * multi-byte space (U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F,
 * U+3000); 0: never the start of a space. */
static unsigned char space_class[256];

void init_space_class(void) {
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

PyObject *split_and_encode(PyObject *module, PyObject *args) {
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
