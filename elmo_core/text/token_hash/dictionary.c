/* The shared dictionary of distinct tokens (see dictionary.h). */
#include "dictionary.h"

int buffer_reserve(Buffer *buf, size_t extra) {
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

int dictionary_init(Dictionary *dict, size_t capacity) {
    memset(dict, 0, sizeof *dict);
    dict->slots = malloc(capacity * sizeof(Slot));
    if (dict->slots == NULL) {
        return -1;
    }
    memset(dict->slots, 0xFF, capacity * sizeof(Slot)); /* id -1 everywhere */
    dict->mask = capacity - 1;
    return 0;
}

void dictionary_free(Dictionary *dict) {
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

int32_t dictionary_lookup(Dictionary *dict, const Pending *pending, int insert) {
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
    if (dict->data.size + (size_t)len > INT32_MAX) { /* int32 offsets, as Arrow's strings */
        return OUT_OF_MEMORY;
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

PyObject *dictionary_offsets(const Dictionary *dict) {
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

int strings_check(Strings *out) {
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

int strings_get(PyObject *args, const char *format, Strings *out) {
    if (!PyArg_ParseTuple(args, format, &out->offsets, &out->data)) {
        return -1;
    }
    return strings_check(out);
}

void strings_release(Strings *strings) {
    PyBuffer_Release(&strings->offsets);
    PyBuffer_Release(&strings->data);
}

int lookup_strings(Dictionary *dict, const Strings *strings, const int64_t *weights, int insert,
                   int32_t *out) {
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
