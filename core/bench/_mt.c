/* Seeded token draws in C: what ``[random.Random(text).randrange(low, high) for _ in range(count)]``
 * returns, for ``dyn.core.bench.trace.seeded_draws``, which TokenSynth makes every trace block's
 * tokens with. In Python that costs a seeding, a bulk draw and a conversion, about 15 us for a
 * 512-token block; here about a third of it. tests/core/bench/test_replay.py compares the two.
 *
 * The generator is MT19937 as CPython's random module runs it (written from Matsumoto and
 * Nishimura's reference algorithm): ``Random(x)`` for an int x runs init_by_array over the 32-bit
 * words of |x|, least significant first; for a str, x is the text's UTF-8 bytes followed by their
 * SHA-512, read big-endian (random.seed, version 2). The caller passes those words as bytes.
 * ``randrange(low, high)`` is low + r, r the first output ``genrand() >> (32 - k)`` below
 * n = high - low, k = n.bit_length() (CPython's _randbelow_with_getrandbits).
 *
 * draws(key: bytes, count: int, low: int, high: int, ints: list | None) -> list[int] | None
 *   key: the seed's words, little-endian, a non-zero multiple of 4 bytes. With ``ints`` (a list
 *   of at least ``high`` ints) the values are its items, shared, instead of new ints. Returns None
 *   where it does not apply (1 <= high - low < 2**32 and 0 <= low fail, or the key or ints do
 *   not fit): the caller then takes the Python path. It raises only MemoryError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define MT_N 624
#define MT_M 397

typedef struct {
    uint32_t mt[MT_N];
    int next;
} mt_state;

static void init_genrand(mt_state *s, uint32_t seed) {
    s->mt[0] = seed;
    for (int i = 1; i < MT_N; i++) s->mt[i] = 1812433253U * (s->mt[i - 1] ^ (s->mt[i - 1] >> 30)) + (uint32_t)i;
    s->next = MT_N;
}

static void init_by_array(mt_state *s, const uint32_t *key, size_t len) {
    init_genrand(s, 19650218U);
    size_t i = 1, j = 0;
    for (size_t k = MT_N > len ? MT_N : len; k; k--) {
        s->mt[i] = (s->mt[i] ^ ((s->mt[i - 1] ^ (s->mt[i - 1] >> 30)) * 1664525U)) + key[j] + (uint32_t)j;
        if (++i >= MT_N) {
            s->mt[0] = s->mt[MT_N - 1];
            i = 1;
        }
        if (++j >= len) j = 0;
    }
    for (size_t k = MT_N - 1; k; k--) {
        s->mt[i] = (s->mt[i] ^ ((s->mt[i - 1] ^ (s->mt[i - 1] >> 30)) * 1566083941U)) - (uint32_t)i;
        if (++i >= MT_N) {
            s->mt[0] = s->mt[MT_N - 1];
            i = 1;
        }
    }
    s->mt[0] = 0x80000000U;  /* a non-zero initial state */
}

static inline uint32_t twist_word(uint32_t upper, uint32_t lower, uint32_t far) {
    uint32_t y = (upper & 0x80000000U) | (lower & 0x7fffffffU);
    return far ^ (y >> 1) ^ ((y & 1U) ? 0x9908b0dfU : 0U);
}

static uint32_t genrand(mt_state *s) {
    uint32_t *mt = s->mt;
    if (s->next >= MT_N) {
        int k = 0;
        for (; k < MT_N - MT_M; k++) mt[k] = twist_word(mt[k], mt[k + 1], mt[k + MT_M]);
        for (; k < MT_N - 1; k++) mt[k] = twist_word(mt[k], mt[k + 1], mt[k + MT_M - MT_N]);
        mt[MT_N - 1] = twist_word(mt[MT_N - 1], mt[0], mt[MT_M - 1]);
        s->next = 0;
    }
    uint32_t y = mt[s->next++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680U;
    y ^= (y << 15) & 0xefc60000U;
    y ^= y >> 18;
    return y;
}

static PyObject *draws(PyObject *self, PyObject *args) {
    Py_buffer key;
    Py_ssize_t count;
    long long low, high;
    PyObject *ints;
    if (!PyArg_ParseTuple(args, "y*nLLO", &key, &count, &low, &high, &ints)) return NULL;
    uint64_t n = (uint64_t)(high - low);
    int usable = key.len > 0 && key.len % 4 == 0 && count >= 0 && low >= 0 && high > low && n < (1ULL << 32);
    if (usable && ints != Py_None) usable = PyList_CheckExact(ints) && PyList_GET_SIZE(ints) >= high;
    if (!usable) {
        PyBuffer_Release(&key);
        Py_RETURN_NONE;
    }
    size_t words = (size_t)key.len / 4;
    uint32_t stack_words[64];
    uint32_t *seed = words <= 64 ? stack_words : PyMem_Malloc(words * sizeof(uint32_t));
    if (seed == NULL) {
        PyBuffer_Release(&key);
        return PyErr_NoMemory();
    }
    const unsigned char *bytes = key.buf;
    for (size_t w = 0; w < words; w++)
        seed[w] = (uint32_t)bytes[4 * w] | (uint32_t)bytes[4 * w + 1] << 8 | (uint32_t)bytes[4 * w + 2] << 16 |
                  (uint32_t)bytes[4 * w + 3] << 24;
    mt_state state;
    init_by_array(&state, seed, words);
    if (seed != stack_words) PyMem_Free(seed);
    PyBuffer_Release(&key);

    int k = 0;  /* n.bit_length(), at most 32 */
    while ((n >> k) != 0) k++;
    PyObject *out = PyList_New(count);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        uint64_t r;
        do {
            r = genrand(&state) >> (32 - k);
        } while (r >= n);
        uint64_t value = (uint64_t)low + r;
        PyObject *item;
        if (ints != Py_None) {
            item = PyList_GET_ITEM(ints, (Py_ssize_t)value);
            Py_INCREF(item);
        } else {
            item = PyLong_FromUnsignedLongLong(value);
            if (item == NULL) {
                Py_DECREF(out);
                return NULL;
            }
        }
        PyList_SET_ITEM(out, i, item);
    }
    return out;
}

static PyMethodDef METHODS[] = {
    {"draws", draws, METH_VARARGS,
     "random.Random(seed).randrange(low, high), count times, from the seed's 32-bit words; or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_mt", NULL, -1, METHODS};

PyMODINIT_FUNC PyInit__mt(void) { return PyModule_Create(&MODULE); }
