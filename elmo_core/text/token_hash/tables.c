/*
 * Tables of distinct tokens that live across calls, for `elmo prepare`.
 *
 * TokenIndex: the word-type table's tokens hashed once per process, so that each block's
 * dictionary finds its type ids with one probe per distinct token (Arrow's index_in re-hashed a
 * block's dictionary and probed it with every type, per block).
 * TokenCounts: occurrences of each distinct token in a few columns (the splits), summed as
 * blocks and files arrive (Arrow needed a group_by over every (block, type) pair), and where
 * each was first seen (the smallest key given), which orders the OOV types deterministically.
 * The fallbacks are in shards.py and type_counts.py; the tests check both agree.
 */
#include "token_hash.h"

/* --- TokenIndex: the positions of a fixed list of distinct tokens ------------------------ */

typedef struct {
    PyObject_HEAD Dictionary dict; /* entry id = position in the list */
} TokenIndex;

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

PyTypeObject TokenIndexType = {
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
    PyObject_HEAD Dictionary dict; /* entries in the order they arrived */
    Buffer counts;                 /* int64[entries x columns] */
    Buffer firsts;                 /* int64[entries]: the smallest first-seen key added */
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
    free(self->firsts.data);
    self->counts = self->firsts = (Buffer){0};
    self->columns = columns;
    if (dictionary_init(&self->dict, 1 << 16) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Grow `buf` to `size` bytes, the new ones set to `fill` (int64 values); 0, or OUT_OF_MEMORY. */
static int grow_int64(Buffer *buf, size_t size, int64_t fill) {
    if (size <= buf->size) {
        return 0;
    }
    if (buffer_reserve(buf, size - buf->size) < 0) {
        return OUT_OF_MEMORY;
    }
    int64_t *at = (int64_t *)(buf->data + buf->size), *end = (int64_t *)(buf->data + size);
    while (at < end) {
        *at++ = fill;
    }
    buf->size = size;
    return 0;
}

/* Add counts[i] to token i's entry in `column` and keep the smaller of its first-seen key and
 * firsts[i]; tokens counted 0 are not added. */
static int token_counts_accumulate(TokenCounts *self, const Strings *tokens, const int64_t *counts,
                                   const int64_t *firsts, int column) {
    int32_t *ids = malloc((size_t)(tokens->count ? tokens->count : 1) * sizeof(int32_t));
    if (ids == NULL || lookup_strings(&self->dict, tokens, counts, 1, ids) < 0) {
        free(ids);
        return OUT_OF_MEMORY;
    }
    size_t entries = (size_t)self->dict.size;
    if (grow_int64(&self->counts, entries * self->columns * sizeof(int64_t), 0) < 0 ||
        grow_int64(&self->firsts, entries * sizeof(int64_t), INT64_MAX) < 0) {
        free(ids);
        return OUT_OF_MEMORY;
    }
    int64_t *totals = (int64_t *)self->counts.data, *first = (int64_t *)self->firsts.data;
    for (Py_ssize_t i = 0; i < tokens->count; i++) {
        if (ids[i] >= 0) {
            totals[(size_t)ids[i] * self->columns + column] += counts[i];
            first[ids[i]] = firsts[i] < first[ids[i]] ? firsts[i] : first[ids[i]];
        }
    }
    free(ids);
    return 0;
}

static PyObject *token_counts_add(TokenCounts *self, PyObject *args) {
    Strings tokens;
    Py_buffer counts, firsts;
    int column;
    if (!PyArg_ParseTuple(args, "y*y*y*y*i:add", &tokens.offsets, &tokens.data, &counts, &firsts,
                          &column)) {
        return NULL;
    }
    if (strings_check(&tokens) < 0) {
        PyBuffer_Release(&counts);
        PyBuffer_Release(&firsts);
        return NULL;
    }
    PyObject *result = NULL;
    if (counts.len != tokens.count * 8 || firsts.len != tokens.count * 8 || column < 0 ||
        column >= self->columns) {
        PyErr_SetString(PyExc_ValueError,
                        "add wants one int64 count and first-seen key per token, and a column");
    } else {
        int status;
        Py_BEGIN_ALLOW_THREADS
        status = token_counts_accumulate(self, &tokens, counts.buf, firsts.buf, column);
        Py_END_ALLOW_THREADS
        if (status < 0) {
            PyErr_NoMemory();
        } else {
            result = Py_NewRef(Py_None);
        }
    }
    strings_release(&tokens);
    PyBuffer_Release(&counts);
    PyBuffer_Release(&firsts);
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

static PyObject *token_counts_firsts(TokenCounts *self, PyObject *unused) {
    return PyBytes_FromStringAndSize(self->firsts.data ? self->firsts.data : "",
                                     (Py_ssize_t)self->firsts.size);
}

static void token_counts_dealloc(TokenCounts *self) {
    dictionary_free(&self->dict);
    free(self->counts.data);
    free(self->firsts.data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef token_counts_methods[] = {
    {"add", (PyCFunction)token_counts_add, METH_VARARGS,
     "add(offsets, data, counts, firsts, column): add int64 counts[i] to token i's entry in "
     "column and keep the smaller of its first-seen key and int64 firsts[i] (tokens distinct, "
     "as Arrow string buffers); tokens counted 0 are not added."},
    {"tokens", (PyCFunction)token_counts_tokens, METH_NOARGS,
     "tokens() -> (offsets, data): the distinct tokens, in the order they arrived, as Arrow "
     "buffers."},
    {"counts", (PyCFunction)token_counts_counts, METH_NOARGS,
     "counts() -> bytes: int64[tokens x columns], row-major."},
    {"firsts", (PyCFunction)token_counts_firsts, METH_NOARGS,
     "firsts() -> bytes: int64[tokens], each token's smallest first-seen key."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject TokenCountsType = {
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
