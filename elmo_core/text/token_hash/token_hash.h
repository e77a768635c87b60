/* What the parts of the _token_hash extension give its module (module.c). */
#ifndef ELMO_TOKEN_HASH_H
#define ELMO_TOKEN_HASH_H

#include "dictionary.h"

/* split.c */
void init_space_class(void);
PyObject *split_and_encode(PyObject *module, PyObject *args);

/* tables.c */
extern PyTypeObject TokenIndexType;
extern PyTypeObject TokenCountsType;

#endif
