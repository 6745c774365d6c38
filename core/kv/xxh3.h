/* XXH3-64's constants and primitives, shared by the C extensions of dyn.core.kv (_xxh3: block
 * and sequence hashes; _radix: the prefix index, which chains sequence hashes itself), with the
 * 9-to-16-byte form whole: a sequence hash is XXH3-64 of two little-endian u64. Written from the
 * algorithm's specification (xxHash's doc/xxhash_spec.md). */
#ifndef DYN_XXH3_H
#define DYN_XXH3_H

#include <stdint.h>
#include <string.h>

#define PRIME32_1 0x9E3779B1U
#define PRIME32_2 0x85EBCA77U
#define PRIME32_3 0xC2B2AE3DU
#define PRIME64_1 0x9E3779B185EBCA87ULL
#define PRIME64_2 0xC2B2AE3D27D4EB4FULL
#define PRIME64_3 0x165667B19E3779F9ULL
#define PRIME64_4 0x85EBCA77C2B2AE63ULL
#define PRIME64_5 0x27D4EB2F165667C5ULL
#define PRIME_MX1 0x165667919E3779F9ULL
#define SECRET_SIZE 192
#define SECRET_SIZE_MIN 136
#define MIDSIZE_MAX 240
#define MIDSIZE_STARTOFFSET 3
#define MIDSIZE_LASTOFFSET 17
#define STRIPE_LEN 64
#define SECRET_CONSUME_RATE 8
#define SECRET_LASTACC_START 7
#define SECRET_MERGEACCS_START 11
#define MAX_BLOCK_BYTES 4096

_Static_assert(sizeof(unsigned long) == 8, "hashes are read and written as unsigned long");

/* XXH3's default secret (kSecret). */
static const uint8_t SECRET[SECRET_SIZE] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "written for little-endian hosts (setup.py marks the extension optional: Python serves there)"
#endif

static inline uint64_t read_le64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline void write_le64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

static inline uint64_t mul128_fold64(uint64_t a, uint64_t b) {
    __uint128_t product = (__uint128_t)a * b;
    return (uint64_t)product ^ (uint64_t)(product >> 64);
}

static inline uint64_t avalanche(uint64_t h) {
    h ^= h >> 37;
    h *= PRIME_MX1;
    return h ^ (h >> 32);
}

static inline uint64_t swap64(uint64_t x) { return __builtin_bswap64(x); }

static inline uint64_t mix16(const uint8_t *in, const uint8_t *secret, uint64_t seed) {
    uint64_t lo = read_le64(in), hi = read_le64(in + 8);
    return mul128_fold64(lo ^ (read_le64(secret) + seed), hi ^ (read_le64(secret + 8) - seed));
}

/* XXH3-64 of 9 to 16 bytes. */
static uint64_t xxh3_9to16(const uint8_t *in, size_t len, uint64_t seed) {
    uint64_t flip_lo = (read_le64(SECRET + 24) ^ read_le64(SECRET + 32)) + seed;
    uint64_t flip_hi = (read_le64(SECRET + 40) ^ read_le64(SECRET + 48)) - seed;
    uint64_t lo = read_le64(in) ^ flip_lo;
    uint64_t hi = read_le64(in + len - 8) ^ flip_hi;
    return avalanche(len + swap64(lo) + hi + mul128_fold64(lo, hi));
}

/* The sequence hash after ``prev``: XXH3-64 of le64(prev) || le64(local) with ``seed``. */
static inline uint64_t xxh3_pair(uint64_t prev, uint64_t local, uint64_t seed) {
    uint8_t pair[16];
    write_le64(pair, prev);
    write_le64(pair + 8, local);
    return xxh3_9to16(pair, 16, seed);
}

#endif
