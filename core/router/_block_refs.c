/* The router's per-block tables in C: booking a request adds its prompt's block hashes, freeing
 * it removes them, and a 4,096-token prompt is 256 of them, so the per-hash work is done here
 * rather than in a Python loop.
 *
 * BlockRefs: one rank's active block refcounts (``dyn.core.router.load.ActiveSequences.refs``).
 *
 * A table block hash (u64) -> count (u32, never 0: a hash whose count falls to 0 is removed), as a
 * dict of int -> int behaves for the calls ``ActiveSequences`` makes. A hash that is not a u64 int
 * raises TypeError or OverflowError (sequence hashes always are one). Not thread-safe beyond the
 * GIL, which every method holds throughout.
 *
 * SoleHolders: the blocks a single rank slot holds, hash -> slot (``dyn.core.router.holders``):
 * at fleet size most booked blocks are held by one rank, and a Python dict of millions of them
 * cost a booking 3x the inserts' time here and, now and then, a rebuild of the whole dict. The
 * same table, with bulk calls: ``put_all`` enters a booking's new blocks, ``pop_all`` removes them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "../kv/u64int.h"
#include "../kv/u64map.h"

typedef struct {
    PyObject_HEAD
    Map32 counts;
} Refs;

static int read_hash(PyObject *item, uint64_t *out) {
    if (!PyLong_Check(item)) {
        PyErr_Format(PyExc_TypeError, "a block hash must be an int, not %.100s", Py_TYPE(item)->tp_name);
        return -1;
    }
    *out = as_u64(item);
    return *out == (uint64_t)-1 && PyErr_Occurred() ? -1 : 0;
}

/* Each hash's count + 1 (``up``: a new hash gets 1) or - 1 (a hash at 1, or absent, goes). */
static PyObject *step_counts(Refs *self, PyObject *hashes, int up) {
    PyObject *fast = PySequence_Fast(hashes, "hashes must be a sequence of ints");
    if (fast == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    PyObject *out = Py_None;
    for (Py_ssize_t i = 0; i < n && out != NULL; i++) {
        uint64_t h;
        uint32_t count = 0;
        if (read_hash(items[i], &h) < 0) {
            out = NULL;
        } else if (up) {
            uint32_t *at = Map32_ref(&self->counts, h, 0);
            if (at == NULL)
                out = PyErr_NoMemory();
            else
                (*at)++;
        } else if (Map32_get(&self->counts, h, &count)) {
            if (count > 1)
                Map32_put(&self->counts, h, count - 1); /* an existing key: cannot fail */
            else
                Map32_pop(&self->counts, h, NULL);
        }
    }
    Py_DECREF(fast);
    Py_XINCREF(out);
    return out;
}

static PyObject *refs_add(Refs *self, PyObject *hashes) { return step_counts(self, hashes, 1); }

static PyObject *refs_remove(Refs *self, PyObject *hashes) { return step_counts(self, hashes, 0); }

/* The (hash, default=None) arguments of get and pop; -1 with an exception when they are wrong. */
static int hash_and_default(PyObject *const *args, Py_ssize_t nargs, const char *usage, uint64_t *h, PyObject **fallback) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    *fallback = nargs == 2 ? args[1] : Py_None;
    return read_hash(args[0], h);
}

static PyObject *count_or(int found, uint32_t count, PyObject *fallback) {
    if (found) return PyLong_FromUnsignedLong(count);
    Py_INCREF(fallback);
    return fallback;
}

/* get(hash, default=None) on a table -> its value, or default. */
static PyObject *table_get(const Map32 *m, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t h;
    uint32_t value = 0;
    PyObject *fallback;
    if (hash_and_default(args, nargs, "get(hash, default=None)", &h, &fallback) < 0) return NULL;
    int found = Map32_get(m, h, &value); /* before value is read */
    return count_or(found, value, fallback);
}

/* pop(hash, default=None) on a table -> its value (removing it), or default. */
static PyObject *table_pop(Map32 *m, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t h;
    uint32_t value = 0;
    PyObject *fallback;
    if (hash_and_default(args, nargs, "pop(hash, default=None)", &h, &fallback) < 0) return NULL;
    int found = Map32_pop(m, h, &value); /* before value is read */
    return count_or(found, value, fallback);
}

/* set(hash, value) on a table: value at least ``least`` (``what`` names it in the error). */
static PyObject *table_set(Map32 *m, PyObject *args, unsigned long least, const char *what) {
    PyObject *item;
    unsigned long value;
    uint64_t h;
    if (!PyArg_ParseTuple(args, "Ok", &item, &value)) return NULL;
    if (read_hash(item, &h) < 0) return NULL;
    if (value < least || value >= NIL) {
        PyErr_Format(PyExc_ValueError, "a %s is at least %lu and below 2**32 - 1", what, least);
        return NULL;
    }
    if (Map32_put(m, h, (uint32_t)value) < 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *refs_get(Refs *self, PyObject *const *args, Py_ssize_t nargs) {
    return table_get(&self->counts, args, nargs);
}

static PyObject *refs_pop(Refs *self, PyObject *const *args, Py_ssize_t nargs) {
    return table_pop(&self->counts, args, nargs);
}

static PyObject *refs_set(Refs *self, PyObject *args) { return table_set(&self->counts, args, 1, "count"); }

/* prefix_depth(seq_hashes) -> how many leading hashes are here (chained hashes: bisection). */
static PyObject *refs_prefix_depth(Refs *self, PyObject *seqs) {
    PyObject *fast = PySequence_Fast(seqs, "seq_hashes must be a sequence of ints");
    if (fast == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast), lo = 1, hi = n;
    PyObject **items = PySequence_Fast_ITEMS(fast);
    uint64_t h;
    if (!self->counts.count || n == 0 || read_hash(items[0], &h) < 0 || !Map32_has(&self->counts, h)) {
        lo = 0;
        hi = 0;
    }
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (read_hash(items[mid], &h) < 0) break;
        if (Map32_has(&self->counts, h))
            lo = mid + 1;
        else
            hi = mid;
    }
    Py_DECREF(fast);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromSsize_t(lo);
}

static Py_ssize_t refs_len(Refs *self) { return (Py_ssize_t)self->counts.count; }

/* ``item in`` a table: False for anything that is not a u64 int. */
static int map_contains(const Map32 *m, PyObject *item) {
    uint64_t h;
    if (!PyLong_Check(item)) return 0;
    h = as_u64(item);
    if (h == (uint64_t)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return Map32_has(m, h);
}

static int refs_contains(Refs *self, PyObject *item) { return map_contains(&self->counts, item); }

static void refs_dealloc(Refs *self) {
    Map32_free(&self->counts);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* ------------------------------------------------------------------ SoleHolders */

typedef struct {
    PyObject_HEAD
    Map32 slots;
} Sole;

/* hashes[start:] through ``each`` (a Map32 call on one hash); -1 with an exception on a bad hash. */
static int each_from(PyObject *hashes, Py_ssize_t start, int (*each)(Map32 *, uint64_t, uint32_t), Map32 *m, uint32_t slot) {
    PyObject *fast = PySequence_Fast(hashes, "hashes must be a sequence of ints");
    if (fast == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    int rc = 0;
    for (Py_ssize_t i = start; i < n && rc == 0; i++) {
        uint64_t h;
        rc = read_hash(items[i], &h) < 0 ? -1 : each(m, h, slot);
    }
    Py_DECREF(fast);
    return rc;
}

static int put_one(Map32 *m, uint64_t h, uint32_t slot) {
    if (Map32_put(m, h, slot) == 0) return 0;
    PyErr_NoMemory();
    return -1;
}

static int pop_one(Map32 *m, uint64_t h, uint32_t unused) {
    Map32_pop(m, h, NULL);
    return 0;
}

/* The (hashes, start[, slot]) arguments of put_all and pop_all. */
static int hashes_from(PyObject *args, int with_slot, PyObject **hashes, Py_ssize_t *start, uint32_t *slot) {
    unsigned long value = 0;
    if (with_slot ? !PyArg_ParseTuple(args, "Onk", hashes, start, &value) : !PyArg_ParseTuple(args, "On", hashes, start))
        return -1;
    if (value >= NIL || *start < 0) {
        PyErr_SetString(PyExc_ValueError, value >= NIL ? "a slot is below 2**32 - 1" : "start is at least 0");
        return -1;
    }
    *slot = (uint32_t)value;
    return 0;
}

/* put_all(hashes, start, slot): hashes[start:] -> slot. */
static PyObject *sole_put_all(Sole *self, PyObject *args) {
    PyObject *hashes;
    Py_ssize_t start;
    uint32_t slot;
    if (hashes_from(args, 1, &hashes, &start, &slot) < 0) return NULL;
    if (each_from(hashes, start, put_one, &self->slots, slot) < 0) return NULL;
    Py_RETURN_NONE;
}

/* pop_all(hashes, start): hashes[start:] removed (those absent ignored). */
static PyObject *sole_pop_all(Sole *self, PyObject *args) {
    PyObject *hashes;
    Py_ssize_t start;
    uint32_t slot;
    if (hashes_from(args, 0, &hashes, &start, &slot) < 0) return NULL;
    if (each_from(hashes, start, pop_one, &self->slots, 0) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *sole_get(Sole *self, PyObject *const *args, Py_ssize_t nargs) {
    return table_get(&self->slots, args, nargs);
}

static PyObject *sole_pop(Sole *self, PyObject *const *args, Py_ssize_t nargs) {
    return table_pop(&self->slots, args, nargs);
}

static PyObject *sole_set(Sole *self, PyObject *args) { return table_set(&self->slots, args, 0, "slot"); }

static Py_ssize_t sole_len(Sole *self) { return (Py_ssize_t)self->slots.count; }

static int sole_contains(Sole *self, PyObject *item) { return map_contains(&self->slots, item); }

static void sole_dealloc(Sole *self) {
    Map32_free(&self->slots);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef SOLE_METHODS[] = {
    {"put_all", (PyCFunction)sole_put_all, METH_VARARGS, "hashes[start:] -> slot."},
    {"pop_all", (PyCFunction)sole_pop_all, METH_VARARGS, "Remove hashes[start:] (absent ones ignored)."},
    {"get", (PyCFunction)(void (*)(void))sole_get, METH_FASTCALL, "A hash's slot, or default."},
    {"pop", (PyCFunction)(void (*)(void))sole_pop, METH_FASTCALL, "Remove a hash; its slot, or default."},
    {"set", (PyCFunction)sole_set, METH_VARARGS, "Set a hash's slot."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods SOLE_SEQUENCE = {
    .sq_length = (lenfunc)sole_len,
    .sq_contains = (objobjproc)sole_contains,
};

static PyTypeObject SOLE_TYPE = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dyn.core.router._block_refs.SoleHolders",
    .tp_basicsize = sizeof(Sole),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Block hash -> the one rank slot holding it (see dyn.core.router.holders).",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)sole_dealloc,
    .tp_methods = SOLE_METHODS,
    .tp_as_sequence = &SOLE_SEQUENCE,
};

/* ------------------------------------------------------------------ the module */

static PyMethodDef REFS_METHODS[] = {
    {"add", (PyCFunction)refs_add, METH_O, "Each hash's count + 1."},
    {"remove", (PyCFunction)refs_remove, METH_O, "Each hash's count - 1; at 0 it goes."},
    {"get", (PyCFunction)(void (*)(void))refs_get, METH_FASTCALL, "A hash's count, or default."},
    {"pop", (PyCFunction)(void (*)(void))refs_pop, METH_FASTCALL, "Remove a hash; its count, or default."},
    {"set", (PyCFunction)refs_set, METH_VARARGS, "Set a hash's count (at least 1)."},
    {"prefix_depth", (PyCFunction)refs_prefix_depth, METH_O, "How many leading hashes are here."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods REFS_SEQUENCE = {
    .sq_length = (lenfunc)refs_len,
    .sq_contains = (objobjproc)refs_contains,
};

static PyTypeObject REFS_TYPE = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dyn.core.router._block_refs.BlockRefs",
    .tp_basicsize = sizeof(Refs),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One rank's active block refcounts (see dyn.core.router.load).",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)refs_dealloc,
    .tp_methods = REFS_METHODS,
    .tp_as_sequence = &REFS_SEQUENCE,
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_block_refs", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__block_refs(void) {
    if (PyType_Ready(&REFS_TYPE) < 0 || PyType_Ready(&SOLE_TYPE) < 0) return NULL;
    PyObject *m = PyModule_Create(&MODULE);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "BlockRefs", (PyObject *)&REFS_TYPE) < 0 ||
        PyModule_AddObjectRef(m, "SoleHolders", (PyObject *)&SOLE_TYPE) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
