/* A Python int read as a u64, for dyn's C extensions (include after Python.h). Where a C long
 * is 64 bits, PyLong_AsUnsignedLong reads the int's digits while PyLong_AsUnsignedLongLong goes
 * through a byte array: 0.95 against 2.6 us for 256 sequence hashes on CPython 3.11. The
 * contract is theirs: (uint64_t)-1 with an exception set for a negative or too large int (the
 * value 2**64 - 1 itself returns -1 with none set); callers check PyLong_Check first. */
#ifndef DYN_U64INT_H
#define DYN_U64INT_H

#include <limits.h>
#include <stdint.h>

static inline uint64_t as_u64(PyObject *item) {
#if ULONG_MAX == UINT64_MAX
    return (uint64_t)PyLong_AsUnsignedLong(item);
#else
    return (uint64_t)PyLong_AsUnsignedLongLong(item);
#endif
}

#endif
