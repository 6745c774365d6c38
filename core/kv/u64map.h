/* Open-addressing tables keyed by u64, shared by the C extensions of dyn (``_radix``: the
 * prefix index; ``_block_refs``: a rank's active block refcounts). Linear probing with
 * backward-shift deletion (no tombstones), at most 3/4 full. Two kinds: Map32 (u32 values, a slot
 * is empty when its value is NIL) and Map64 (u64 values, keys < 2**64 - 1, a slot is empty when
 * its key is UINT64_MAX). Out of memory: ``put`` returns -1 and leaves the table as it was. */
#ifndef DYN_U64MAP_H
#define DYN_U64MAP_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NIL UINT32_MAX

static inline uint64_t mix(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    return k ^ (k >> 33);
}

#define DEFINE_MAP(NAME, VT, EMPTY, SET_EMPTY)                                                    \
    typedef struct {                                                                              \
        uint64_t *keys;                                                                           \
        VT *vals;                                                                                 \
        uint64_t mask, count;                                                                     \
    } NAME;                                                                                       \
    static inline int NAME##_empty(const NAME *m, uint64_t i) { return EMPTY; }                   \
    static int NAME##_alloc(NAME *m, uint64_t cap) {                                              \
        m->keys = malloc(cap * sizeof(uint64_t));                                                 \
        m->vals = malloc(cap * sizeof(VT));                                                       \
        if (m->keys == NULL || m->vals == NULL) {                                                 \
            free(m->keys);                                                                        \
            free(m->vals);                                                                        \
            m->keys = NULL;                                                                       \
            m->vals = NULL;                                                                       \
            return -1;                                                                            \
        }                                                                                         \
        m->mask = cap - 1;                                                                        \
        for (uint64_t i = 0; i < cap; i++) SET_EMPTY;                                             \
        return 0;                                                                                 \
    }                                                                                             \
    static void NAME##_free(NAME *m) {                                                            \
        free(m->keys);                                                                            \
        free(m->vals);                                                                            \
        memset(m, 0, sizeof(*m));                                                                 \
    }                                                                                             \
    static uint64_t NAME##_slot(const NAME *m, uint64_t key) {                                    \
        uint64_t i = mix(key) & m->mask;                                                          \
        while (!NAME##_empty(m, i) && m->keys[i] != key) i = (i + 1) & m->mask;                   \
        return i;                                                                                 \
    }                                                                                             \
    static int NAME##_has(const NAME *m, uint64_t key) {                                          \
        return m->count && !NAME##_empty(m, NAME##_slot(m, key));                                 \
    }                                                                                             \
    static int NAME##_get(const NAME *m, uint64_t key, VT *out) {                                 \
        if (!m->count) return 0;                                                                  \
        uint64_t i = NAME##_slot(m, key);                                                         \
        if (NAME##_empty(m, i)) return 0;                                                         \
        *out = m->vals[i];                                                                        \
        return 1;                                                                                 \
    }                                                                                             \
    /* Room for one more entry, growing at 3/4 full; -1 (the table as it was) out of memory. */ \
    static int NAME##_reserve(NAME *m) {                                                          \
        if (m->keys != NULL && (m->count + 1) * 4 <= (m->mask + 1) * 3) return 0;                \
        NAME old = *m;                                                                            \
        uint64_t cap = m->keys == NULL ? 8 : (m->mask + 1) * 2;                                   \
        if (NAME##_alloc(m, cap) < 0) {                                                           \
            *m = old;                                                                             \
            return -1;                                                                            \
        }                                                                                         \
        m->count = old.count;                                                                     \
        for (uint64_t j = 0; old.keys != NULL && j <= old.mask; j++) {                            \
            if (NAME##_empty(&old, j)) continue;                                                  \
            uint64_t i = NAME##_slot(m, old.keys[j]);                                             \
            m->keys[i] = old.keys[j];                                                             \
            m->vals[i] = old.vals[j];                                                             \
        }                                                                                         \
        free(old.keys);                                                                           \
        free(old.vals);                                                                           \
        return 0;                                                                                 \
    }                                                                                             \
    static int NAME##_put(NAME *m, uint64_t key, VT val) {                                        \
        if (m->count) {                                                                           \
            uint64_t at = NAME##_slot(m, key);                                                    \
            if (!NAME##_empty(m, at)) {                                                           \
                m->vals[at] = val;                                                                \
                return 0;                                                                         \
            }                                                                                     \
        }                                                                                         \
        if (NAME##_reserve(m) < 0) return -1;                                                     \
        uint64_t i = NAME##_slot(m, key);                                                         \
        m->count++;                                                                               \
        m->keys[i] = key;                                                                         \
        m->vals[i] = val;                                                                         \
        return 0;                                                                                 \
    }                                                                                             \
    /* The value of ``key``, entered as ``fresh`` (not the empty mark) when absent, found with  \
     * one probe; NULL out of memory. The pointer holds until the next insertion. */             \
    static VT *NAME##_ref(NAME *m, uint64_t key, VT fresh) {                                      \
        if (NAME##_reserve(m) < 0) return NULL;                                                   \
        uint64_t i = NAME##_slot(m, key);                                                         \
        if (NAME##_empty(m, i)) {                                                                 \
            m->count++;                                                                           \
            m->keys[i] = key;                                                                     \
            m->vals[i] = fresh;                                                                   \
        }                                                                                         \
        return &m->vals[i];                                                                       \
    }                                                                                             \
    static int NAME##_pop(NAME *m, uint64_t key, VT *out) {                                       \
        if (!m->count) return 0;                                                                  \
        uint64_t i = NAME##_slot(m, key);                                                         \
        if (NAME##_empty(m, i)) return 0;                                                         \
        if (out != NULL) *out = m->vals[i];                                                       \
        for (uint64_t j = (i + 1) & m->mask; !NAME##_empty(m, j); j = (j + 1) & m->mask) {        \
            uint64_t home = mix(m->keys[j]) & m->mask;                                            \
            /* the entry at j may move to i when its home is not cyclically in (i, j] */           \
            if (i <= j ? (home <= i || home > j) : (home <= i && home > j)) {                     \
                m->keys[i] = m->keys[j];                                                          \
                m->vals[i] = m->vals[j];                                                          \
                i = j;                                                                            \
            }                                                                                     \
        }                                                                                         \
        SET_EMPTY;                                                                                \
        m->count--;                                                                               \
        return 1;                                                                                 \
    }                                                                                             \

DEFINE_MAP(Map32, uint32_t, m->vals[i] == NIL, m->vals[i] = NIL)
DEFINE_MAP(Map64, uint64_t, m->keys[i] == UINT64_MAX, m->keys[i] = UINT64_MAX)

#endif
