/* The _token_hash extension module: see split.c, tables.c and dictionary.h. */
#include "token_hash.h"

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
