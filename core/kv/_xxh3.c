/* Block and sequence hashes in C: the two loops of dyn.core.kv.hashing, for the lengths a KV
 * block takes, so that hashing a 4,096-token prompt costs microseconds instead of tens of them.
 *
 * XXH3-64 with a seed, written from the algorithm's specification (xxHash's doc/xxhash_spec.md)
 * for the inputs that occur here: 9-16 bytes (a sequence hash: two little-endian u64), 17-128 and
 * 129-240 bytes (a block of 3 to 60 u32 tokens) and the long form (a block of 61 to 1,024
 * tokens: stripes over a secret derived from the seed). Other inputs are not handled here: the
 * Python wrapper hashes them with the xxhash package. tests/core/kv/test_hashing.py checks every
 * length class against that package.
 *
 * Contract of both functions: they return a new list of ints, or None when the input is not
 * what they take (not a list, a value out of range); the caller then runs the Python path,
 * which gives its own result or error. They never raise for bad input.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "xxh3.h"

/* XXH3-64 of 17 to 128 bytes. */
static uint64_t xxh3_17to128(const uint8_t *in, size_t len, uint64_t seed) {
    uint64_t acc = len * PRIME64_1;
    if (len > 32) {
        if (len > 64) {
            if (len > 96) {
                acc += mix16(in + 48, SECRET + 96, seed);
                acc += mix16(in + len - 64, SECRET + 112, seed);
            }
            acc += mix16(in + 32, SECRET + 64, seed);
            acc += mix16(in + len - 48, SECRET + 80, seed);
        }
        acc += mix16(in + 16, SECRET + 32, seed);
        acc += mix16(in + len - 32, SECRET + 48, seed);
    }
    acc += mix16(in, SECRET, seed);
    acc += mix16(in + len - 16, SECRET + 16, seed);
    return avalanche(acc);
}

/* XXH3-64 of 129 to 240 bytes. */
static uint64_t xxh3_129to240(const uint8_t *in, size_t len, uint64_t seed) {
    uint64_t acc = len * PRIME64_1;
    size_t rounds = len / 16;
    for (size_t i = 0; i < 8; i++) acc += mix16(in + 16 * i, SECRET + 16 * i, seed);
    acc = avalanche(acc);
    for (size_t i = 8; i < rounds; i++)
        acc += mix16(in + 16 * i, SECRET + 16 * (i - 8) + MIDSIZE_STARTOFFSET, seed);
    acc += mix16(in + len - 16, SECRET + SECRET_SIZE_MIN - MIDSIZE_LASTOFFSET, seed);
    return avalanche(acc);
}

/* The long form's secret for a seed: kSecret with the seed added to each 16 bytes' first half
 * and taken from the second. */
static void derive_secret(uint8_t out[SECRET_SIZE], uint64_t seed) {
    for (int i = 0; i < SECRET_SIZE / 16; i++) {
        write_le64(out + 16 * i, read_le64(SECRET + 16 * i) + seed);
        write_le64(out + 16 * i + 8, read_le64(SECRET + 16 * i + 8) - seed);
    }
}

static inline void accumulate_stripe(uint64_t acc[8], const uint8_t *in, const uint8_t *secret) {
    for (int i = 0; i < 8; i++) {
        uint64_t value = read_le64(in + 8 * i);
        uint64_t key = value ^ read_le64(secret + 8 * i);
        acc[i ^ 1] += value;
        acc[i] += (uint64_t)(uint32_t)key * (key >> 32);
    }
}

static inline void scramble(uint64_t acc[8], const uint8_t *secret) {
    for (int i = 0; i < 8; i++) {
        uint64_t a = acc[i];
        a ^= a >> 47;
        a ^= read_le64(secret + 8 * i);
        acc[i] = a * PRIME32_1;
    }
}

/* XXH3-64 of more than 240 bytes, over the seed's derived ``secret``. */
static uint64_t xxh3_long(const uint8_t *in, size_t len, const uint8_t *secret) {
    uint64_t acc[8] = {PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1};
    const size_t stripes_per_block = (SECRET_SIZE - STRIPE_LEN) / SECRET_CONSUME_RATE;
    const size_t block_len = STRIPE_LEN * stripes_per_block;
    size_t blocks = (len - 1) / block_len;
    for (size_t b = 0; b < blocks; b++) {
        for (size_t s = 0; s < stripes_per_block; s++)
            accumulate_stripe(acc, in + b * block_len + s * STRIPE_LEN, secret + s * SECRET_CONSUME_RATE);
        scramble(acc, secret + SECRET_SIZE - STRIPE_LEN);
    }
    size_t stripes = ((len - 1) - block_len * blocks) / STRIPE_LEN;
    for (size_t s = 0; s < stripes; s++)
        accumulate_stripe(acc, in + blocks * block_len + s * STRIPE_LEN, secret + s * SECRET_CONSUME_RATE);
    accumulate_stripe(acc, in + len - STRIPE_LEN, secret + SECRET_SIZE - STRIPE_LEN - SECRET_LASTACC_START);
    uint64_t result = len * PRIME64_1;
    for (int i = 0; i < 4; i++) {
        const uint8_t *key = secret + SECRET_MERGEACCS_START + 16 * i;
        result += mul128_fold64(acc[2 * i] ^ read_le64(key), acc[2 * i + 1] ^ read_le64(key + 8));
    }
    return avalanche(result);
}

/* ``long_secret``: the seed's derived secret, read only for inputs over 240 bytes. */
static uint64_t xxh3_block(const uint8_t *in, size_t len, uint64_t seed, const uint8_t *long_secret) {
    if (len <= 16) return xxh3_9to16(in, len, seed);
    if (len <= 128) return xxh3_17to128(in, len, seed);
    if (len <= MIDSIZE_MAX) return xxh3_129to240(in, len, seed);
    return xxh3_long(in, len, long_secret);
}

/* A token id as u32, or -1 when it is not an int in 0..2**32-1. On CPython 3.11 the one- and
 * two-digit ints every vocabulary uses are read from their digits, which is most of the cost of
 * hashing a prompt; later versions changed that layout and take the API call. */
static inline int64_t token_u32(PyObject *item) {
    if (!PyLong_Check(item)) return -1;
#if PY_VERSION_HEX < 0x030C0000
    Py_ssize_t size = Py_SIZE(item);
    const digit *d = ((PyLongObject *)item)->ob_digit;
    if (size == 0) return 0;
    if (size == 1) return (int64_t)d[0];
    if (size == 2 && PyLong_SHIFT == 30) {
        uint64_t v = (uint64_t)d[0] | ((uint64_t)d[1] << 30);
        return v <= 0xFFFFFFFFULL ? (int64_t)v : -1;
    }
#endif
    unsigned long v = PyLong_AsUnsignedLong(item);
    if (v == (unsigned long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return v <= 0xFFFFFFFFUL ? (int64_t)v : -1;
}

/* block_hashes(tokens: list[int], block_size: int, seed: int) -> list[int] | None */
static PyObject *block_hashes(PyObject *self, PyObject *args) {
    PyObject *tokens;
    Py_ssize_t block_size;
    unsigned long long seed;
    if (!PyArg_ParseTuple(args, "OnK", &tokens, &block_size, &seed)) return NULL;
    size_t block_bytes = (size_t)block_size * 4;
    if (!PyList_CheckExact(tokens) || block_size < 3 || block_bytes > MAX_BLOCK_BYTES) Py_RETURN_NONE;
    Py_ssize_t n_blocks = PyList_GET_SIZE(tokens) / block_size;
    PyObject *out = PyList_New(n_blocks);
    if (out == NULL) return NULL;
    uint32_t buf[MAX_BLOCK_BYTES / 4];
    uint8_t long_secret[SECRET_SIZE];
    if (block_bytes > MIDSIZE_MAX) derive_secret(long_secret, (uint64_t)seed);
    for (Py_ssize_t b = 0; b < n_blocks; b++) {
        for (Py_ssize_t i = 0; i < block_size; i++) {
            int64_t v = token_u32(PyList_GET_ITEM(tokens, b * block_size + i));
            if (v < 0) {
                Py_DECREF(out);
                Py_RETURN_NONE;
            }
            buf[i] = (uint32_t)v;
        }
        PyObject *h = PyLong_FromUnsignedLong(xxh3_block((const uint8_t *)buf, block_bytes, (uint64_t)seed, long_secret));
        if (h == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, b, h);
    }
    return out;
}

/* sequence_hashes(local: list[int], seed: int) -> list[int] | None */
static PyObject *sequence_hashes(PyObject *self, PyObject *args) {
    PyObject *local;
    unsigned long long seed;
    if (!PyArg_ParseTuple(args, "OK", &local, &seed)) return NULL;
    if (!PyList_CheckExact(local)) Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(local);
    PyObject *out = PyList_New(n);
    if (out == NULL) return NULL;
    uint64_t prev = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(local, i);
        if (!PyLong_Check(item)) goto not_mine;
        /* PyLong_AsUnsignedLong reads the digits; the LongLong variant goes through bytes */
        uint64_t h = PyLong_AsUnsignedLong(item);
        if (h == (uint64_t)-1 && PyErr_Occurred()) goto not_mine;
        if (i == 0) {
            prev = h;
            Py_INCREF(item);
            PyList_SET_ITEM(out, 0, item);
            continue;
        }
        prev = xxh3_pair(prev, h, (uint64_t)seed);
        PyObject *value = PyLong_FromUnsignedLong(prev);
        if (value == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, value);
    }
    return out;
not_mine:
    PyErr_Clear();
    Py_DECREF(out);
    Py_RETURN_NONE;
}

static PyMethodDef METHODS[] = {
    {"block_hashes", block_hashes, METH_VARARGS,
     "XXH3-64 of each full block of u32 tokens (3 to 1,024 tokens a block), or None."},
    {"sequence_hashes", sequence_hashes, METH_VARARGS,
     "The chain of sequence hashes over local block hashes (u64 each), or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_xxh3", NULL, -1, METHODS};

PyMODINIT_FUNC PyInit__xxh3(void) { return PyModule_Create(&MODULE); }
