/*
 * Moving the rows of a list column held flat (offsets + values), for the prepare stage's
 * shuffle: pass 2 groups each block's training sentences by shard, and each shard's sentences
 * are then put in their shuffled order.
 *
 * take_rows(offsets, values, order) -> (new_offsets, new_values), both bytearrays:
 *   offsets      int64[n+1]  row i is values[offsets[i]:offsets[i+1]]
 *   values       int32[...]
 *   order        int64[m]    the rows to take, in output order, each in [0, n)
 *   new_offsets  int64[m+1]  starting at 0
 *   new_values   int32[new_offsets[m]]
 *
 * Why C: NumPy needs a repeat, an arange, an add and a fancy index over every value (four
 * passes and two int64 temporaries per value); here each row is one memcpy. The NumPy version
 * (elmo_core/data/rows.py) stays as the fallback when this module is not built, and the tests
 * check that both agree.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* 0 when offsets rise from >= 0 and stay within num_values, and every order is a row. */
static int check_rows(const int64_t *offsets, Py_ssize_t num_rows, Py_ssize_t num_values,
                      const int64_t *order, Py_ssize_t num_order) {
    if (offsets[0] < 0 || offsets[num_rows] > num_values) {
        PyErr_SetString(PyExc_ValueError, "offsets must lie within the values");
        return -1;
    }
    for (Py_ssize_t i = 0; i < num_rows; i++) {
        if (offsets[i] > offsets[i + 1]) {
            PyErr_Format(PyExc_ValueError, "offsets fall at row %zd", i);
            return -1;
        }
    }
    for (Py_ssize_t i = 0; i < num_order; i++) {
        if (order[i] < 0 || order[i] >= num_rows) {
            PyErr_Format(PyExc_IndexError, "order[%zd] = %lld is not a row", i,
                         (long long)order[i]);
            return -1;
        }
    }
    return 0;
}

static PyObject *take(const int64_t *offsets, const int32_t *values, const int64_t *order,
                      Py_ssize_t num_order) {
    PyObject *new_offsets = PyByteArray_FromStringAndSize(NULL, (num_order + 1) * 8);
    if (new_offsets == NULL) {
        return NULL;
    }
    int64_t *out_offsets = (int64_t *)PyByteArray_AS_STRING(new_offsets);
    out_offsets[0] = 0;
    for (Py_ssize_t i = 0; i < num_order; i++) {
        out_offsets[i + 1] = out_offsets[i] + offsets[order[i] + 1] - offsets[order[i]];
    }
    PyObject *new_values = PyByteArray_FromStringAndSize(NULL, out_offsets[num_order] * 4);
    if (new_values == NULL) {
        Py_DECREF(new_offsets);
        return NULL;
    }
    int32_t *out_values = (int32_t *)PyByteArray_AS_STRING(new_values);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < num_order; i++) {
        int64_t row = order[i];
        memcpy(out_values + out_offsets[i], values + offsets[row],
               (size_t)(offsets[row + 1] - offsets[row]) * 4);
    }
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(NN)", new_offsets, new_values);
}

static PyObject *take_rows(PyObject *module, PyObject *args) {
    Py_buffer offsets, values, order;
    if (!PyArg_ParseTuple(args, "y*y*y*:take_rows", &offsets, &values, &order)) {
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t num_rows = offsets.len / 8 - 1;
    if (offsets.len % 8 || num_rows < 0 || values.len % 4 || order.len % 8) {
        PyErr_SetString(PyExc_ValueError,
                        "take_rows wants int64 offsets[n+1], int32 values, int64 order");
    } else if (check_rows(offsets.buf, num_rows, values.len / 4, order.buf, order.len / 8) == 0) {
        result = take(offsets.buf, values.buf, order.buf, order.len / 8);
    }
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&values);
    PyBuffer_Release(&order);
    return result;
}

static PyMethodDef methods[] = {
    {"take_rows", take_rows, METH_VARARGS,
     "take_rows(offsets, values, order) -> (new_offsets, new_values): rows `order` of a list "
     "column held as int64 offsets and int32 values."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_rows", "Moving the rows of a flat list column in C.", -1, methods,
};

PyMODINIT_FUNC PyInit__rows(void) { return PyModule_Create(&module_def); }
