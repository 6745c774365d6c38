/* The prefix index's tree in C: ``RadixCore``, the engine of ``dyn.core.kv.indexer_c``.
 *
 * The same tree, events and answers as the Python tree (``dyn.core.kv.indexer_py``, whose module
 * docstring states them), stored so that one cached block costs tens of bytes instead of hundreds:
 *
 * - Nodes live in one array (48 bytes each): sequence hash, local hash, the engine's block hash
 *   (the first holder's name), parent, depth, holders, and the child links (first child, next and
 *   previous sibling). Node 0 is the root. A freed node goes on a free list through ``kid``.
 * - ``seq``: an open-addressing table (the others are u64map.h's), sequence hash -> node (4 bytes a slot; the key is read from
 *   the node). A node is its sequence hash: a child is found by hashing its parent's sequence hash
 *   with the child's local hash, so there is no child table.
 * - Holders: one worker id inline (the common case) or, for two or more, a bitset in a pool; a
 *   holder set is always in that canonical form, so two sets are equal when their fields are.
 * - Per worker id: ``lookup`` (the engine's block hash -> node, 12 bytes a slot), ``alias`` (node
 *   -> its own block hash, only where it differs from the node's), ``holes`` (node -> children it
 *   holds below a node it lacks). ``hole_of`` counts, per node, the workers with a hole there.
 *
 * Worker ids are given by the Python side (``add_worker`` / ``drop_worker``); the core knows no
 * (instance, rank) keys, except that queries that answer per worker take the list that maps ids
 * to keys. Hashes are unsigned 64-bit ints: a block or local hash outside that range makes a
 * ``store`` INVALID_BLOCK and is a missing hash in ``remove``. Single writer; every method holds the
 * GIL throughout. Out of memory raises MemoryError and may leave an event half applied.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
#include "u64int.h"
#include "u64map.h"
#include "xxh3.h"

#define MANY 0x80000000u /* holders: a set index (in the pool) rather than a worker id */
#define ROOT 0u
#define MAX_IDS 0x7FFFFFFFu /* worker ids and nodes: below MANY */

enum { ST_OK, ST_PARENT_NOT_FOUND, ST_BLOCK_NOT_FOUND, ST_INVALID, ST_NEW_WORKER };

typedef struct {
    uint64_t seq, local, block;
    uint32_t parent, depth, holders, kid, next, prev;
} Node;

typedef struct {
    uint32_t words, count;
    uint64_t bits[];
} HolderSet;

typedef struct {
    int used;
    Map32 lookup; /* block hash -> node */
    Map64 alias;  /* node -> block hash, where it is not the node's */
    Map32 holes;  /* node -> how many of its children this worker holds */
} Worker;

typedef struct {
    PyObject_HEAD
    uint64_t seed;
    Node *nodes;
    uint32_t n_nodes, cap_nodes, free_node, live;
    uint32_t *seq; /* the sequence-hash table: node per slot, NIL empty */
    uint64_t seq_mask, seq_count;
    HolderSet **sets;
    uint32_t n_sets, cap_sets, free_set;
    Worker *workers;
    uint32_t n_workers;
    Map32 hole_of;  /* node -> how many workers have a hole there */
    uint64_t holes; /* hole entries over all workers */
} Core;

/* ------------------------------------------------------------------------------- seq table */

static uint64_t seq_slot(const Core *c, uint64_t seq) {
    uint64_t i = mix(seq) & c->seq_mask;
    while (c->seq[i] != NIL && c->nodes[c->seq[i]].seq != seq) i = (i + 1) & c->seq_mask;
    return i;
}

static uint32_t seq_find(const Core *c, uint64_t seq) { return c->seq[seq_slot(c, seq)]; }

static int seq_insert(Core *c, uint32_t node) {
    if ((c->seq_count + 1) * 4 > (c->seq_mask + 1) * 3) {
        uint64_t cap = (c->seq_mask + 1) * 2;
        uint32_t *grown = malloc(cap * sizeof(uint32_t)), *old = c->seq;
        if (grown == NULL) return -1;
        memset(grown, 0xFF, cap * sizeof(uint32_t));
        uint64_t old_cap = c->seq_mask + 1;
        c->seq = grown;
        c->seq_mask = cap - 1;
        for (uint64_t j = 0; j < old_cap; j++)
            if (old[j] != NIL) c->seq[seq_slot(c, c->nodes[old[j]].seq)] = old[j];
        free(old);
    }
    c->seq[seq_slot(c, c->nodes[node].seq)] = node;
    c->seq_count++;
    return 0;
}

static void seq_delete(Core *c, uint64_t seq) {
    uint64_t i = seq_slot(c, seq), mask = c->seq_mask;
    if (c->seq[i] == NIL) return;
    for (uint64_t j = (i + 1) & mask; c->seq[j] != NIL; j = (j + 1) & mask) {
        uint64_t home = mix(c->nodes[c->seq[j]].seq) & mask;
        if (i <= j ? (home <= i || home > j) : (home <= i && home > j)) {
            c->seq[i] = c->seq[j];
            i = j;
        }
    }
    c->seq[i] = NIL;
    c->seq_count--;
}

/* ------------------------------------------------------------------------------ holder sets */

static inline HolderSet *set_of(const Core *c, uint32_t h) { return c->sets[h & ~MANY]; }

static int has(const Core *c, uint32_t h, uint32_t wid) {
    if (h == NIL) return 0;
    if (!(h & MANY)) return h == wid;
    HolderSet *s = set_of(c, h);
    return wid / 64 < s->words && (s->bits[wid / 64] >> (wid % 64) & 1);
}

static int set_new(Core *c, uint32_t words, uint32_t *out) {
    HolderSet *s = calloc(1, sizeof(HolderSet) + words * sizeof(uint64_t));
    if (s == NULL) return -1;
    s->words = words;
    uint32_t index;
    if (c->free_set != NIL) {
        index = c->free_set;
        c->free_set = (uint32_t)(uintptr_t)c->sets[index];
    } else {
        if (c->n_sets == c->cap_sets) {
            uint32_t cap = c->cap_sets ? c->cap_sets * 2 : 64;
            HolderSet **grown = realloc(c->sets, cap * sizeof(HolderSet *));
            if (grown == NULL) {
                free(s);
                return -1;
            }
            c->sets = grown;
            c->cap_sets = cap;
        }
        index = c->n_sets++;
    }
    c->sets[index] = s;
    *out = index | MANY;
    return 0;
}

static void set_release(Core *c, uint32_t h) {
    uint32_t index = h & ~MANY;
    free(c->sets[index]);
    c->sets[index] = (HolderSet *)(uintptr_t)c->free_set;
    c->free_set = index;
}

static inline void set_bit(HolderSet *s, uint32_t wid) {
    uint64_t bit = 1ULL << (wid % 64);
    if (!(s->bits[wid / 64] & bit)) {
        s->bits[wid / 64] |= bit;
        s->count++;
    }
}

/* Add ``wid`` to the holders ``*h``. */
static int add_holder(Core *c, uint32_t *h, uint32_t wid) {
    if (*h == NIL) {
        *h = wid;
        return 0;
    }
    if (!(*h & MANY)) {
        if (*h == wid) return 0;
        uint32_t other = *h, top = other > wid ? other : wid, index;
        if (set_new(c, top / 64 + 1, &index) < 0) return -1;
        set_bit(set_of(c, index), other);
        set_bit(set_of(c, index), wid);
        *h = index;
        return 0;
    }
    HolderSet *s = set_of(c, *h);
    if (wid / 64 >= s->words) {
        uint32_t words = wid / 64 + 1;
        HolderSet *grown = realloc(s, sizeof(HolderSet) + words * sizeof(uint64_t));
        if (grown == NULL) return -1;
        memset(grown->bits + grown->words, 0, (words - grown->words) * sizeof(uint64_t));
        grown->words = words;
        c->sets[*h & ~MANY] = grown;
        s = grown;
    }
    set_bit(s, wid);
    return 0;
}

/* Take ``wid`` off the holders ``*h`` (nothing when it is not there). */
static void drop_holder_bit(Core *c, uint32_t *h, uint32_t wid) {
    if (*h == NIL) return;
    if (!(*h & MANY)) {
        if (*h == wid) *h = NIL;
        return;
    }
    HolderSet *s = set_of(c, *h);
    uint64_t bit = 1ULL << (wid % 64);
    if (wid / 64 >= s->words || !(s->bits[wid / 64] & bit)) return;
    s->bits[wid / 64] &= ~bit;
    if (--s->count > 1) return;
    for (uint32_t w = 0; w < s->words; w++) /* one left: back to the inline form */
        if (s->bits[w]) {
            uint32_t last = w * 64 + (uint32_t)__builtin_ctzll(s->bits[w]);
            set_release(c, *h);
            *h = last;
            return;
        }
}

static void holders_release(Core *c, uint32_t h) {
    if (h != NIL && (h & MANY)) set_release(c, h);
}

static int same_holders(const Core *c, uint32_t a, uint32_t b) {
    if (a == b) return 1;
    if (a == NIL || b == NIL || !(a & MANY) || !(b & MANY)) return 0;
    HolderSet *x = set_of(c, a), *y = set_of(c, b);
    if (x->count != y->count) return 0;
    uint32_t n = x->words < y->words ? x->words : y->words;
    if (memcmp(x->bits, y->bits, n * sizeof(uint64_t))) return 0;
    for (uint32_t w = n; w < x->words; w++)
        if (x->bits[w]) return 0;
    for (uint32_t w = n; w < y->words; w++)
        if (y->bits[w]) return 0;
    return 1;
}

/* Holders as a list of worker ids; ``out`` has room for ``n_workers`` ids. Returns how many. */
static uint32_t members(const Core *c, uint32_t h, uint32_t *out) {
    if (h == NIL) return 0;
    if (!(h & MANY)) {
        out[0] = h;
        return 1;
    }
    HolderSet *s = set_of(c, h);
    uint32_t n = 0;
    for (uint32_t w = 0; w < s->words; w++)
        for (uint64_t bits = s->bits[w]; bits; bits &= bits - 1)
            out[n++] = w * 64 + (uint32_t)__builtin_ctzll(bits);
    return n;
}

/* ``a & ~b`` (``b`` NIL: nothing) as a Python int bitmask over worker ids. */
static PyObject *mask_of(const Core *c, uint32_t a, uint32_t b) {
    uint32_t words = (c->n_workers + 63) / 64 + 1;
    uint64_t small[4], *buf = words <= 4 ? small : calloc(words, sizeof(uint64_t));
    if (buf == NULL) return PyErr_NoMemory();
    memset(buf, 0, words * sizeof(uint64_t));
    uint32_t hs[2] = {a, b};
    for (int k = 0; k < 2; k++) {
        uint32_t h = hs[k];
        if (h == NIL) continue;
        if (!(h & MANY)) {
            if (k == 0)
                buf[h / 64] |= 1ULL << (h % 64);
            else
                buf[h / 64] &= ~(1ULL << (h % 64));
            continue;
        }
        HolderSet *s = set_of(c, h);
        for (uint32_t w = 0; w < s->words && w < words; w++) buf[w] = k == 0 ? s->bits[w] : buf[w] & ~s->bits[w];
    }
    PyObject *out = _PyLong_FromByteArray((const unsigned char *)buf, words * 8, 1, 0);
    if (buf != small) free(buf);
    return out;
}

/* -------------------------------------------------------------------------------- nodes */

static int node_new(Core *c, uint32_t *out) {
    if (c->free_node != NIL) {
        *out = c->free_node;
        c->free_node = c->nodes[*out].kid;
    } else {
        if (c->n_nodes == c->cap_nodes) {
            if (c->cap_nodes >= MAX_IDS) {
                PyErr_SetString(PyExc_MemoryError, "the index holds 2**31 nodes, its most");
                return -1;
            }
            uint32_t cap = c->cap_nodes * 2;
            Node *grown = realloc(c->nodes, (size_t)cap * sizeof(Node));
            if (grown == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            c->nodes = grown;
            c->cap_nodes = cap;
        }
        *out = c->n_nodes++;
    }
    c->live++;
    return 0;
}

static void node_free(Core *c, uint32_t node) {
    Node *n = &c->nodes[node];
    n->holders = NIL;
    n->parent = NIL;
    n->kid = c->free_node;
    c->free_node = node;
    c->live--;
}

static void add_child(Core *c, uint32_t parent, uint32_t child) {
    Node *p = &c->nodes[parent], *k = &c->nodes[child];
    k->next = p->kid;
    k->prev = NIL;
    if (p->kid != NIL) c->nodes[p->kid].prev = child;
    p->kid = child;
}

static void remove_child(Core *c, uint32_t parent, uint32_t child) {
    Node *k = &c->nodes[child];
    if (k->prev != NIL)
        c->nodes[k->prev].next = k->next;
    else
        c->nodes[parent].kid = k->next;
    if (k->next != NIL) c->nodes[k->next].prev = k->prev;
}

static uint32_t kids_held(const Core *c, uint32_t node, uint32_t wid) {
    uint32_t n = 0;
    for (uint32_t k = c->nodes[node].kid; k != NIL; k = c->nodes[k].next) n += has(c, c->nodes[k].holders, wid);
    return n;
}

/* The block hash ``wid`` names ``node`` by (the worker must hold it). */
static uint64_t own_name(const Core *c, uint32_t node, uint32_t wid) {
    uint64_t name = c->nodes[node].block;
    if (c->workers[wid].alias.count) Map64_get(&c->workers[wid].alias, node, &name);
    return name;
}

/* ---------------------------------------------------------------------------------- holes */

static void drop_hole_flag(Core *c, uint32_t node) {
    uint32_t n;
    if (!Map32_get(&c->hole_of, node, &n)) return;
    if (n > 1)
        Map32_put(&c->hole_of, node, n - 1); /* an existing key: no growth, cannot fail */
    else
        Map32_pop(&c->hole_of, node, NULL);
}

static void unhole(Core *c, uint32_t node, uint32_t wid) {
    if (Map32_pop(&c->workers[wid].holes, node, NULL)) {
        c->holes--;
        drop_hole_flag(c, node);
    }
}

static int detach(Core *c, uint32_t top);

/* Keep the tree and the hole records right after worker ``wid`` left ``node``. */
static int after_loss(Core *c, uint32_t node, uint32_t wid, int recount) {
    Worker *w = &c->workers[wid];
    uint32_t parent = c->nodes[node].parent, count;
    if (Map32_get(&w->holes, parent, &count)) {
        uint32_t left = recount ? kids_held(c, parent, wid) : count - 1;
        if (left)
            Map32_put(&w->holes, parent, left);
        else
            unhole(c, parent, wid);
    }
    if (c->nodes[node].holders == NIL) return detach(c, node);
    if (c->nodes[node].kid != NIL) {
        uint32_t below = kids_held(c, node, wid);
        if (below) {
            int fresh = !Map32_has(&w->holes, node);
            if (Map32_put(&w->holes, node, below) < 0) return -1;
            if (fresh) {
                uint32_t n = 0;
                Map32_get(&c->hole_of, node, &n);
                if (Map32_put(&c->hole_of, node, n + 1) < 0) return -1;
                c->holes++;
            }
        }
    }
    return 0;
}

/* Cut ``top`` (held by no one) and its subtree off the tree, forgetting every entry. */
static int detach(Core *c, uint32_t top) {
    remove_child(c, c->nodes[top].parent, top);
    uint32_t *stack = malloc(64 * sizeof(uint32_t)), depth = 0, cap = 64;
    uint32_t *ids = malloc((c->n_workers + 1) * sizeof(uint32_t));
    if (stack == NULL || ids == NULL) {
        free(stack);
        free(ids);
        PyErr_NoMemory();
        return -1;
    }
    stack[depth++] = top;
    while (depth) {
        uint32_t node = stack[--depth];
        Node *n = &c->nodes[node];
        uint32_t held = members(c, n->holders, ids);
        for (uint32_t k = 0; k < held; k++) {
            Worker *w = &c->workers[ids[k]];
            uint64_t name = n->block;
            if (w->alias.count) Map64_pop(&w->alias, node, &name);
            uint32_t at;
            if (Map32_get(&w->lookup, name, &at) && at == node) Map32_pop(&w->lookup, name, NULL);
        }
        holders_release(c, n->holders);
        if (c->holes && Map32_pop(&c->hole_of, node, NULL)) {
            for (uint32_t wid = 0; wid < c->n_workers; wid++)
                if (c->workers[wid].holes.count && Map32_pop(&c->workers[wid].holes, node, NULL)) c->holes--;
        }
        for (uint32_t k = n->kid; k != NIL; k = c->nodes[k].next) {
            if (depth == cap) {
                uint32_t *grown = realloc(stack, cap * 2 * sizeof(uint32_t));
                if (grown == NULL) {
                    free(stack);
                    free(ids);
                    PyErr_NoMemory();
                    return -1;
                }
                stack = grown;
                cap *= 2;
            }
            stack[depth++] = k;
        }
        seq_delete(c, n->seq);
        node_free(c, node);
    }
    free(stack);
    free(ids);
    return 0;
}

/* Take ``wid`` off ``node`` (the caller settles holes and detaching). */
static void drop_holder(Core *c, uint32_t node, uint32_t wid) {
    drop_holder_bit(c, &c->nodes[node].holders, wid);
    if (c->workers[wid].alias.count) Map64_pop(&c->workers[wid].alias, node, NULL);
}

/* ------------------------------------------------------------------------- argument reading */

/* The u64 values of a sequence into a new array; 1 with *bad set when one is not a u64. */
static uint64_t *read_u64s(PyObject *seq, Py_ssize_t *n, int *bad) {
    PyObject *fast = PySequence_Fast(seq, "hashes must be a sequence of ints");
    if (fast == NULL) return NULL;
    *n = PySequence_Fast_GET_SIZE(fast);
    uint64_t *out = malloc((*n ? *n : 1) * sizeof(uint64_t));
    if (out == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return NULL;
    }
    PyObject **items = PySequence_Fast_ITEMS(fast);
    *bad = 0;
    for (Py_ssize_t i = 0; i < *n; i++) {
        if (!PyLong_Check(items[i])) {
            *bad = 1;
            out[i] = 0;
            continue;
        }
        out[i] = as_u64(items[i]);
        if (out[i] == (uint64_t)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            *bad = 1;
        }
    }
    Py_DECREF(fast);
    return out;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Whether the values are distinct and none is ``parent`` (when ``has_parent``). */
static int distinct(const uint64_t *values, Py_ssize_t n, int has_parent, uint64_t parent) {
    if (n <= 16) {
        for (Py_ssize_t i = 0; i < n; i++) {
            if (has_parent && values[i] == parent) return 0;
            for (Py_ssize_t j = i + 1; j < n; j++)
                if (values[i] == values[j]) return 0;
        }
        return 1;
    }
    uint64_t *sorted = malloc(n * sizeof(uint64_t));
    if (sorted == NULL) return -1;
    memcpy(sorted, values, n * sizeof(uint64_t));
    qsort(sorted, n, sizeof(uint64_t), cmp_u64);
    int ok = 1;
    for (Py_ssize_t i = 0; ok && i < n; i++)
        if ((i && sorted[i] == sorted[i - 1]) || (has_parent && sorted[i] == parent)) ok = 0;
    free(sorted);
    return ok;
}

static int check_wid(const Core *c, long wid) {
    if (wid < 0 || (unsigned long)wid >= c->n_workers || !c->workers[wid].used) {
        PyErr_Format(PyExc_ValueError, "worker id %ld is not in the index", wid);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------------- events */

/* store(wid, parent_hash | None, block_hashes, local_hashes, seq_hashes | None) -> status.
 * wid -1: a worker the index does not know yet; the answer is then INVALID_BLOCK,
 * PARENT_BLOCK_NOT_FOUND or NEW_WORKER (register it and store again). */
static PyObject *core_store(Core *c, PyObject *args) {
    long wid;
    PyObject *parent_obj, *blocks_obj, *locals_obj, *seqs_obj;
    if (!PyArg_ParseTuple(args, "lOOOO", &wid, &parent_obj, &blocks_obj, &locals_obj, &seqs_obj)) return NULL;
    if (wid != -1 && check_wid(c, wid) < 0) return NULL;
    Py_ssize_t n, n_locals, n_seqs = 0;
    int bad = 0, bad_locals = 0, bad_seqs = 0, status = ST_OK;
    uint64_t *blocks = NULL, *locals = NULL, *seqs = NULL, *displaced = NULL;
    uint32_t n_displaced = 0;
    blocks = read_u64s(blocks_obj, &n, &bad);
    if (blocks == NULL) goto error;
    locals = read_u64s(locals_obj, &n_locals, &bad_locals);
    if (locals == NULL) goto error;
    if (seqs_obj != Py_None) {
        seqs = read_u64s(seqs_obj, &n_seqs, &bad_seqs);
        if (seqs == NULL) goto error;
    }
    int has_parent = parent_obj != Py_None, unknown_parent = 0;
    uint64_t parent = 0;
    if (has_parent) {
        parent = PyLong_Check(parent_obj) ? as_u64(parent_obj) : (uint64_t)-1;
        if (parent == (uint64_t)-1 && (!PyLong_Check(parent_obj) || PyErr_Occurred())) {
            PyErr_Clear();
            unknown_parent = 1; /* not a u64: a name no worker holds */
        }
    }
    if (n != n_locals || (seqs != NULL && n_seqs != n) || bad || bad_locals || bad_seqs) {
        status = ST_INVALID;
        goto done;
    }
    int ok = distinct(blocks, n, has_parent && !unknown_parent, parent);
    if (ok < 0) goto nomem;
    if (!ok) {
        status = ST_INVALID;
        goto done;
    }
    uint32_t node = ROOT;
    if (has_parent) {
        if (wid == -1 || unknown_parent || !Map32_get(&c->workers[wid].lookup, parent, &node)) {
            status = ST_PARENT_NOT_FOUND;
            goto done;
        }
    } else if (wid == -1) {
        status = ST_NEW_WORKER;
        goto done;
    }
    Worker *w = &c->workers[wid];
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t s = seqs != NULL ? seqs[i] : node == ROOT ? locals[i] : xxh3_pair(c->nodes[node].seq, locals[i], c->seed);
        uint64_t block = blocks[i];
        uint32_t child = seq_find(c, s), elsewhere;
        if (child != NIL) { /* a node that exists */
            Node *k = &c->nodes[child];
            int holds = has(c, k->holders, (uint32_t)wid);
            uint64_t held = holds ? own_name(c, child, (uint32_t)wid) : 0;
            if (!holds || held != block) {
                if (holds) {
                    Map32_pop(&w->lookup, held, NULL); /* same node, the engine renamed it */
                } else if (w->holes.count && Map32_has(&w->holes, child)) {
                    unhole(c, child, (uint32_t)wid);
                }
                if (Map32_get(&w->lookup, block, &elsewhere)) { /* the hash moves here */
                    drop_holder(c, elsewhere, (uint32_t)wid);
                    uint64_t *grown = realloc(displaced, (n_displaced + 1) * sizeof(uint64_t));
                    if (grown == NULL) goto nomem;
                    displaced = grown;
                    displaced[n_displaced++] = c->nodes[elsewhere].seq;
                }
                if (add_holder(c, &c->nodes[child].holders, (uint32_t)wid) < 0) goto nomem;
                if (block == c->nodes[child].block) {
                    if (w->alias.count) Map64_pop(&w->alias, child, NULL);
                } else if (Map64_put(&w->alias, child, block) < 0) {
                    goto nomem;
                }
                if (Map32_put(&w->lookup, block, child) < 0) goto nomem;
            }
            node = child;
            continue;
        }
        if (node_new(c, &child) < 0) goto error; /* a new node: the only child of the one before */
        Node *k = &c->nodes[child];
        k->seq = s;
        k->local = locals[i];
        k->block = block;
        k->parent = node;
        k->depth = c->nodes[node].depth + 1;
        k->holders = (uint32_t)wid;
        k->kid = NIL;
        add_child(c, node, child);
        if (seq_insert(c, child) < 0) goto nomem;
        if (Map32_get(&w->lookup, block, &elsewhere)) {
            drop_holder(c, elsewhere, (uint32_t)wid);
            uint64_t *grown = realloc(displaced, (n_displaced + 1) * sizeof(uint64_t));
            if (grown == NULL) goto nomem;
            displaced = grown;
            displaced[n_displaced++] = c->nodes[elsewhere].seq;
        }
        if (Map32_put(&w->lookup, block, child) < 0) goto nomem;
        node = child;
    }
    for (uint32_t i = 0; i < n_displaced; i++) { /* settle the nodes hashes moved away from */
        uint32_t old = seq_find(c, displaced[i]);
        if (old != NIL && !has(c, c->nodes[old].holders, (uint32_t)wid) && after_loss(c, old, (uint32_t)wid, 1) < 0)
            goto error;
    }
done:
    free(blocks);
    free(locals);
    free(seqs);
    free(displaced);
    return PyLong_FromLong(status);
nomem:
    PyErr_NoMemory();
error:
    free(blocks);
    free(locals);
    free(seqs);
    free(displaced);
    return NULL;
}

/* remove(wid, block_hashes) -> status: hashes the worker does not hold are skipped. */
static PyObject *core_remove(Core *c, PyObject *args) {
    long wid;
    PyObject *blocks_obj;
    if (!PyArg_ParseTuple(args, "lO", &wid, &blocks_obj)) return NULL;
    if (check_wid(c, wid) < 0) return NULL;
    Py_ssize_t n;
    int bad;
    uint64_t *blocks = read_u64s(blocks_obj, &n, &bad);
    if (blocks == NULL) return NULL;
    Worker *w = &c->workers[wid];
    int missing = bad;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t node;
        if (!Map32_pop(&w->lookup, blocks[i], &node)) {
            missing = 1;
            continue;
        }
        Node *k = &c->nodes[node];
        drop_holder(c, node, (uint32_t)wid);
        if (k->holders != NIL || k->kid != NIL || c->holes) {
            if ((k->kid != NIL || c->holes) && after_loss(c, node, (uint32_t)wid, 0) < 0) {
                free(blocks);
                return NULL;
            }
        } else { /* the common case, an evicted leaf and no holes anywhere: unlink it */
            remove_child(c, k->parent, node);
            seq_delete(c, k->seq);
            node_free(c, node);
        }
    }
    free(blocks);
    return PyLong_FromLong(missing ? ST_BLOCK_NOT_FOUND : ST_OK);
}

/* clear(wid): every block of one worker goes; the worker stays. */
static PyObject *core_clear(Core *c, PyObject *args) {
    long wid;
    if (!PyArg_ParseTuple(args, "l", &wid)) return NULL;
    if (check_wid(c, wid) < 0) return NULL;
    Worker *w = &c->workers[wid];
    uint64_t count = w->lookup.count, k = 0;
    uint32_t *nodes = malloc((count ? count : 1) * sizeof(uint32_t));
    if (nodes == NULL) return PyErr_NoMemory();
    for (uint64_t i = 0; w->lookup.keys != NULL && i <= w->lookup.mask; i++)
        if (w->lookup.vals[i] != NIL) nodes[k++] = w->lookup.vals[i];
    Map32_free(&w->lookup);
    Map64_free(&w->alias);
    for (uint64_t i = 0; i < k; i++) { /* a node freed on the way has no holders */
        uint32_t node = nodes[i], h = c->nodes[node].holders;
        if (!has(c, h, (uint32_t)wid)) continue;
        drop_holder_bit(c, &c->nodes[node].holders, (uint32_t)wid);
        if (h == (uint32_t)wid && detach(c, node) < 0) {
            free(nodes);
            return NULL;
        }
    }
    free(nodes);
    Map32 *holes = &w->holes;
    for (uint64_t i = 0; holes->keys != NULL && i <= holes->mask; i++)
        if (holes->vals[i] != NIL) {
            drop_hole_flag(c, (uint32_t)holes->keys[i]);
            c->holes--;
        }
    Map32_free(holes);
    Py_RETURN_NONE;
}

/* add_worker(wid): a worker id with no blocks (growing the table as needed). */
static PyObject *core_add_worker(Core *c, PyObject *args) {
    long wid;
    if (!PyArg_ParseTuple(args, "l", &wid)) return NULL;
    if (wid < 0 || (unsigned long)wid >= MAX_IDS) {
        PyErr_Format(PyExc_ValueError, "worker id %ld is out of range", wid);
        return NULL;
    }
    if ((uint32_t)wid >= c->n_workers) {
        uint32_t n = (uint32_t)wid + 1;
        Worker *grown = realloc(c->workers, n * sizeof(Worker));
        if (grown == NULL) return PyErr_NoMemory();
        memset(grown + c->n_workers, 0, (n - c->n_workers) * sizeof(Worker));
        c->workers = grown;
        c->n_workers = n;
    }
    c->workers[wid].used = 1;
    Py_RETURN_NONE;
}

/* drop_worker(wid): forget a cleared worker id. */
static PyObject *core_drop_worker(Core *c, PyObject *args) {
    long wid;
    if (!PyArg_ParseTuple(args, "l", &wid)) return NULL;
    if (check_wid(c, wid) < 0) return NULL;
    Worker *w = &c->workers[wid];
    if (w->lookup.count || w->holes.count) {
        PyErr_SetString(PyExc_ValueError, "clear a worker before dropping it");
        return NULL;
    }
    Map32_free(&w->lookup);
    Map64_free(&w->alias);
    Map32_free(&w->holes);
    w->used = 0;
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------ queries */

/* A query's path: nodes by depth, from its sequence hashes (``items``, each read when a probe
 * needs it: a bisection reads a few of a long prompt's) or walked from its local hashes. */
typedef struct {
    PyObject **items;
    uint32_t n;
    const uint32_t *walked;
} Path;

/* The node at ``depth`` of a path of sequence hashes; NIL when absent (or not a u64). */
static uint32_t seq_node(const Core *c, const Path *p, uint32_t depth) {
    PyObject *item = p->items[depth - 1];
    if (!PyLong_Check(item)) return NIL;
    uint64_t seq = as_u64(item);
    if (seq == (uint64_t)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return NIL;
    }
    return seq_find(c, seq);
}

static uint32_t node_at(const Core *c, const Path *p, uint32_t depth) {
    return p->walked != NULL ? p->walked[depth - 1] : seq_node(c, p, depth);
}

static uint32_t holders_at(const Core *c, const Path *p, uint32_t depth) {
    uint32_t node = node_at(c, p, depth);
    return node == NIL ? NIL : c->nodes[node].holders;
}

/* The depth of the deepest node of the query's path in the tree (0: not even its first). */
static uint32_t span(const Core *c, const Path *p) {
    uint32_t n = p->n;
    if (!n || seq_node(c, p, 1) == NIL) return 0;
    if (seq_node(c, p, n) != NIL) return n;
    uint32_t lo = 1, hi = n; /* a node at depth lo exists, at depth hi does not */
    while (hi - lo > 1) {
        uint32_t mid = (lo + hi) / 2;
        if (seq_node(c, p, mid) == NIL)
            hi = mid;
        else
            lo = mid;
    }
    return lo;
}

typedef struct {
    uint32_t depth, top, bottom; /* a piece: holders ``top & ~bottom`` matched ``depth`` */
} Piece;

typedef struct {
    uint32_t lo, hi, top, bottom;
} Range;

/* Ranges a bisection can have pending: it goes depth first and each level adds at most two. */
#define MAX_PENDING 80

/* The answer as pieces (no holes anywhere): holder sets shrink with depth, so equal sets mean
 * no change between two depths and each change is found by bisection. */
static Piece *pieces(const Core *c, const Path *p, uint32_t depth, uint32_t *count) {
    uint32_t first = holders_at(c, p, 1), last = holders_at(c, p, depth), n = 0, cap = 8, top = 0;
    Range stack[MAX_PENDING];
    Piece *out = malloc(cap * sizeof(Piece));
    if (out == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    out[n++] = (Piece){depth, last, NIL};
    if (!same_holders(c, first, last)) stack[top++] = (Range){1, depth, first, last};
    while (top) {
        Range r = stack[--top];
        if (r.hi - r.lo == 1) {
            if (n == cap) {
                Piece *more = realloc(out, cap * 2 * sizeof(Piece));
                if (more == NULL) {
                    free(out);
                    PyErr_NoMemory();
                    return NULL;
                }
                out = more;
                cap *= 2;
            }
            out[n++] = (Piece){r.lo, r.top, r.bottom};
            continue;
        }
        uint32_t mid = (r.lo + r.hi) / 2, h = holders_at(c, p, mid);
        if (!same_holders(c, h, r.top)) stack[top++] = (Range){r.lo, mid, r.top, h};
        if (!same_holders(c, h, r.bottom)) stack[top++] = (Range){mid, r.hi, h, r.bottom};
    }
    *count = n;
    return out;
}

static int set_score(PyObject *scores, PyObject *keys, uint32_t wid, uint32_t depth) {
    if ((Py_ssize_t)wid >= PyList_GET_SIZE(keys)) {
        PyErr_SetString(PyExc_ValueError, "keys does not name every worker id");
        return -1;
    }
    PyObject *d = PyLong_FromUnsignedLong(depth);
    if (d == NULL) return -1;
    int rc = PyDict_SetItem(scores, PyList_GET_ITEM(keys, wid), d);
    Py_DECREF(d);
    return rc;
}

/* ``out`` = the holders ``h`` as a bitset of ``words`` words, masked by ``clean``. */
static void load_bits(const Core *c, uint32_t h, const uint64_t *clean, uint64_t *out, uint32_t words) {
    memset(out, 0, words * sizeof(uint64_t));
    if (h == NIL) return;
    if (!(h & MANY)) {
        out[h / 64] = 1ULL << (h % 64);
    } else {
        HolderSet *s = set_of(c, h);
        memcpy(out, s->bits, (s->words < words ? s->words : words) * sizeof(uint64_t));
    }
    for (uint32_t w = 0; w < words; w++) out[w] &= clean[w];
}

/* Score the workers set in ``bits`` (a bitset of ``words``) at ``depth``. */
static int score_bits(PyObject *scores, PyObject *keys, const uint64_t *bits, uint32_t words, uint32_t depth) {
    for (uint32_t w = 0; w < words; w++)
        for (uint64_t b = bits[w]; b; b &= b - 1)
            if (set_score(scores, keys, w * 64 + (uint32_t)__builtin_ctzll(b), depth) < 0) return -1;
    return 0;
}

/* Scores per worker key while some worker has holes: the workers without holes by bisection over
 * their holder sets (masked to them, which stay nested), each worker with holes by bisection
 * above its first hole on the path, where it is prefix-closed. */
static int scores_with_holes(const Core *c, const Path *p, uint32_t depth, PyObject *keys, PyObject *scores) {
    uint32_t words = c->n_workers / 64 + 1, top = 0;
    uint64_t *buf = calloc((size_t)words * 3, sizeof(uint64_t)), *clean = buf, *upper = buf + words, *lower = buf + 2 * words;
    if (buf == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(clean, 0xFF, words * sizeof(uint64_t));
    for (uint32_t wid = 0; wid < c->n_workers; wid++)
        if (c->workers[wid].holes.count) clean[wid / 64] &= ~(1ULL << (wid % 64));
    load_bits(c, holders_at(c, p, depth), clean, lower, words);
    if (score_bits(scores, keys, lower, words, depth) < 0) goto fail;
    struct {
        uint32_t lo, hi;
    } stack[MAX_PENDING];
    stack[top].lo = 1;
    stack[top++].hi = depth;
    while (top) { /* a range's ends hold H(lo) and H(hi): the holder sets at those depths */
        uint32_t lo = stack[--top].lo, hi = stack[top].hi;
        load_bits(c, holders_at(c, p, lo), clean, upper, words);
        load_bits(c, holders_at(c, p, hi), clean, lower, words);
        if (!memcmp(upper, lower, words * sizeof(uint64_t))) continue;
        if (hi - lo == 1) {
            for (uint32_t w = 0; w < words; w++) upper[w] &= ~lower[w];
            if (score_bits(scores, keys, upper, words, lo) < 0) goto fail;
            continue;
        }
        uint32_t mid = (lo + hi) / 2;
        stack[top].lo = lo;
        stack[top++].hi = mid;
        stack[top].lo = mid;
        stack[top++].hi = hi;
    }
    uint32_t first = holders_at(c, p, 1);
    for (uint32_t wid = 0; wid < c->n_workers; wid++) {
        const Map32 *holes = &c->workers[wid].holes;
        if (!holes->count || !has(c, first, wid)) continue;
        uint32_t cap = depth + 1; /* the first hole on this path */
        for (uint64_t i = 0; i <= holes->mask; i++) {
            if (holes->vals[i] == NIL) continue;
            uint32_t hole = (uint32_t)holes->keys[i], d = c->nodes[hole].depth;
            if (d < cap && node_at(c, p, d) == hole) cap = d;
        }
        uint32_t lo = 1, hi = cap;
        while (hi - lo > 1) {
            uint32_t mid = (lo + hi) / 2;
            if (has(c, holders_at(c, p, mid), wid))
                lo = mid;
            else
                hi = mid;
        }
        if (set_score(scores, keys, wid, lo) < 0) goto fail;
    }
    free(buf);
    return 0;
fail:
    free(buf);
    return -1;
}

/* A query's hashes as a Path (``*fast`` to release); -1 with an exception when not a sequence. */
static int open_path(PyObject *obj, PyObject **fast, Path *p) {
    *fast = PySequence_Fast(obj, "the query's hashes must be a sequence of ints");
    if (*fast == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(*fast);
    p->items = PySequence_Fast_ITEMS(*fast);
    p->n = n > (Py_ssize_t)UINT32_MAX - 1 ? UINT32_MAX - 1 : (uint32_t)n;
    p->walked = NULL;
    return 0;
}

/* Walk a path of local hashes down the tree (chaining their sequence hashes while the nodes
 * exist) into ``walked``; the depth reached. */
static uint32_t walk(const Core *c, const Path *p, uint32_t *walked) {
    uint64_t prev = 0;
    uint32_t depth = 0;
    for (; depth < p->n; depth++) {
        PyObject *item = p->items[depth];
        uint64_t local = PyLong_Check(item) ? as_u64(item) : (uint64_t)-1;
        if (local == (uint64_t)-1 && (!PyLong_Check(item) || PyErr_Occurred())) {
            PyErr_Clear();
            break;
        }
        uint64_t seq = depth == 0 ? local : xxh3_pair(prev, local, c->seed);
        uint32_t node = seq_find(c, seq);
        if (node == NIL) break;
        walked[depth] = node;
        prev = seq;
    }
    return depth;
}

/* scores(hashes, keys, walk) -> {key: depth}: ``hashes`` are the query's sequence hashes, or with
 * ``walk`` its local hashes (chained here while the nodes exist). ``keys[wid]`` is each worker
 * id's key. */
static PyObject *core_scores(Core *c, PyObject *args) {
    PyObject *hashes_obj, *keys, *fast;
    int by_walk;
    if (!PyArg_ParseTuple(args, "OO!p", &hashes_obj, &PyList_Type, &keys, &by_walk)) return NULL;
    Path p;
    if (open_path(hashes_obj, &fast, &p) < 0) return NULL;
    uint32_t *walked = NULL, *ids = NULL, depth, count;
    Piece *found = NULL;
    PyObject *scores = NULL;
    if (by_walk) {
        walked = malloc((p.n ? p.n : 1) * sizeof(uint32_t));
        if (walked == NULL) goto nomem;
        depth = walk(c, &p, walked);
        p.walked = walked;
    } else {
        depth = span(c, &p);
    }
    scores = PyDict_New();
    if (scores == NULL || depth == 0) goto done;
    if (c->holes) {
        if (scores_with_holes(c, &p, depth, keys, scores) < 0) Py_CLEAR(scores);
        goto done;
    }
    found = pieces(c, &p, depth, &count);
    if (found == NULL) {
        Py_CLEAR(scores);
        goto done;
    }
    ids = malloc((c->n_workers + 1) * sizeof(uint32_t));
    if (ids == NULL) goto nomem;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t held = members(c, found[i].top, ids);
        for (uint32_t k = 0; k < held; k++)
            if (!has(c, found[i].bottom, ids[k]) && set_score(scores, keys, ids[k], found[i].depth) < 0) {
                Py_CLEAR(scores);
                goto done;
            }
    }
    goto done;
nomem:
    PyErr_NoMemory();
    Py_CLEAR(scores);
done:
    Py_DECREF(fast);
    free(walked);
    free(found);
    free(ids);
    return scores;
}

/* pieces(seq_hashes) -> [(depth, holder bitmask)] | None: None while a worker has holes. */
static PyObject *core_pieces(Core *c, PyObject *seqs_obj) {
    if (c->holes) Py_RETURN_NONE;
    PyObject *fast;
    Path p;
    if (open_path(seqs_obj, &fast, &p) < 0) return NULL;
    uint32_t depth = span(c, &p), count = 0;
    PyObject *out = PyList_New(0);
    Piece *found = out == NULL || depth == 0 ? NULL : pieces(c, &p, depth, &count);
    Py_DECREF(fast);
    if (found == NULL) {
        if (PyErr_Occurred()) Py_CLEAR(out);
        return out;
    }
    for (uint32_t i = 0; i < count; i++) {
        PyObject *mask = mask_of(c, found[i].top, found[i].bottom);
        PyObject *item = mask == NULL ? NULL : Py_BuildValue("(IN)", found[i].depth, mask);
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            Py_CLEAR(out);
            break;
        }
        Py_DECREF(item);
    }
    free(found);
    return out;
}

/* dump() -> [(wid, parent's name | None, own name, local hash)], breadth first. */
static PyObject *core_dump(Core *c, PyObject *Py_UNUSED(ignored)) {
    PyObject *out = PyList_New(0);
    uint32_t *queue = malloc(((size_t)c->live + 1) * sizeof(uint32_t)), *ids = malloc((c->n_workers + 1) * sizeof(uint32_t));
    if (out == NULL || queue == NULL || ids == NULL) goto fail;
    size_t head = 0, tail = 0;
    for (uint32_t k = c->nodes[ROOT].kid; k != NIL; k = c->nodes[k].next) queue[tail++] = k;
    while (head < tail) {
        uint32_t node = queue[head++];
        const Node *n = &c->nodes[node];
        uint32_t held = members(c, n->holders, ids);
        for (uint32_t k = 0; k < held; k++) {
            uint32_t wid = ids[k];
            PyObject *item;
            if (n->parent == ROOT)
                item = Py_BuildValue("(IOKK)", wid, Py_None, own_name(c, node, wid), n->local);
            else if (has(c, c->nodes[n->parent].holders, wid))
                item = Py_BuildValue("(IKKK)", wid, own_name(c, n->parent, wid), own_name(c, node, wid), n->local);
            else
                continue; /* held below a node the worker lacks: can never match */
            if (item == NULL || PyList_Append(out, item) < 0) {
                Py_XDECREF(item);
                goto fail;
            }
            Py_DECREF(item);
        }
        for (uint32_t k = n->kid; k != NIL; k = c->nodes[k].next) queue[tail++] = k;
    }
    free(queue);
    free(ids);
    return out;
fail:
    if (!PyErr_Occurred()) PyErr_NoMemory();
    Py_XDECREF(out);
    free(queue);
    free(ids);
    return NULL;
}

static PyObject *core_held(Core *c, PyObject *args) {
    long wid;
    if (!PyArg_ParseTuple(args, "l", &wid)) return NULL;
    if (check_wid(c, wid) < 0) return NULL;
    return PyLong_FromUnsignedLongLong(c->workers[wid].lookup.count);
}

/* block_hash_of(wid, seq) -> the worker's name for that node, or None. */
static PyObject *core_block_hash_of(Core *c, PyObject *args) {
    long wid;
    unsigned long long seq;
    if (!PyArg_ParseTuple(args, "lK", &wid, &seq)) return NULL;
    if (check_wid(c, wid) < 0) return NULL;
    uint32_t node = seq_find(c, seq);
    if (node == NIL || !has(c, c->nodes[node].holders, (uint32_t)wid)) Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(own_name(c, node, (uint32_t)wid));
}

static PyObject *core_depth(Core *c, PyObject *arg) {
    uint64_t seq = PyLong_Check(arg) ? as_u64(arg) : (uint64_t)-1;
    if (seq == (uint64_t)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return PyLong_FromLong(0);
    }
    uint32_t node = seq_find(c, seq);
    return PyLong_FromUnsignedLong(node == NIL ? 0 : c->nodes[node].depth);
}

static PyObject *core_depth_histogram(Core *c, PyObject *Py_UNUSED(ignored)) {
    PyObject *out = PyDict_New();
    if (out == NULL) return NULL;
    uint32_t max = 0;
    for (uint32_t i = 1; i < c->n_nodes; i++)
        if (c->nodes[i].parent != NIL && c->nodes[i].depth > max) max = c->nodes[i].depth;
    uint64_t *counts = calloc((size_t)max + 1, sizeof(uint64_t));
    if (counts == NULL) {
        Py_DECREF(out);
        return PyErr_NoMemory();
    }
    for (uint32_t i = 1; i < c->n_nodes; i++)
        if (c->nodes[i].parent != NIL) counts[c->nodes[i].depth]++;
    for (uint32_t d = 1; d <= max; d++) {
        if (!counts[d]) continue;
        PyObject *k = PyLong_FromUnsignedLong(d), *v = PyLong_FromUnsignedLongLong(counts[d]);
        if (k == NULL || v == NULL || PyDict_SetItem(out, k, v) < 0) {
            Py_XDECREF(k);
            Py_XDECREF(v);
            Py_DECREF(out);
            free(counts);
            return NULL;
        }
        Py_DECREF(k);
        Py_DECREF(v);
    }
    free(counts);
    return out;
}

/* hole_counts() -> {(wid, node's sequence hash): children held}. */
static PyObject *core_hole_counts(Core *c, PyObject *Py_UNUSED(ignored)) {
    PyObject *out = PyDict_New();
    for (uint32_t wid = 0; out != NULL && wid < c->n_workers; wid++) {
        const Map32 *holes = &c->workers[wid].holes;
        for (uint64_t i = 0; holes->count && i <= holes->mask; i++) {
            if (holes->vals[i] == NIL) continue;
            PyObject *k = Py_BuildValue("(IK)", wid, c->nodes[holes->keys[i]].seq);
            PyObject *v = PyLong_FromUnsignedLong(holes->vals[i]);
            if (k == NULL || v == NULL || PyDict_SetItem(out, k, v) < 0) Py_CLEAR(out);
            Py_XDECREF(k);
            Py_XDECREF(v);
            if (out == NULL) return NULL;
        }
    }
    return out;
}

/* -------------------------------------------------------------------------------- the type */

static int core_init(Core *c, PyObject *args, PyObject *kwds) {
    unsigned long long seed;
    static char *names[] = {"seed", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "K", names, &seed)) return -1;
    if (c->nodes != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "RadixCore is initialised once");
        return -1;
    }
    c->seed = seed;
    c->cap_nodes = 1024;
    c->nodes = malloc(c->cap_nodes * sizeof(Node));
    c->seq_mask = 1023;
    c->seq = malloc((c->seq_mask + 1) * sizeof(uint32_t));
    if (c->nodes == NULL || c->seq == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(c->seq, 0xFF, (c->seq_mask + 1) * sizeof(uint32_t));
    c->nodes[ROOT] = (Node){0, 0, 0, NIL, 0, NIL, NIL, NIL, NIL};
    c->n_nodes = 1;
    c->live = 0;
    c->free_node = NIL;
    c->free_set = NIL;
    return 0;
}

static void core_dealloc(Core *c) {
    /* a free slot of the pool holds the next free index, not a set: mark those first */
    uint8_t *is_free = c->n_sets ? calloc(c->n_sets, 1) : NULL;
    for (uint32_t f = c->free_set; is_free != NULL && f != NIL; f = (uint32_t)(uintptr_t)c->sets[f]) is_free[f] = 1;
    for (uint32_t i = 0; i < c->n_sets; i++)
        if (is_free == NULL || !is_free[i]) free(c->sets[i]);
    free(is_free);
    free(c->sets);
    for (uint32_t w = 0; w < c->n_workers; w++) {
        Map32_free(&c->workers[w].lookup);
        Map64_free(&c->workers[w].alias);
        Map32_free(&c->workers[w].holes);
    }
    free(c->workers);
    Map32_free(&c->hole_of);
    free(c->nodes);
    free(c->seq);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyObject *core_get_entries(Core *c, void *Py_UNUSED(closure)) {
    uint64_t n = 0;
    for (uint32_t w = 0; w < c->n_workers; w++) n += c->workers[w].lookup.count;
    return PyLong_FromUnsignedLongLong(n);
}
static PyObject *core_get_holes(Core *c, void *Py_UNUSED(closure)) { return PyLong_FromUnsignedLongLong(c->holes); }
static PyObject *core_get_nodes(Core *c, void *Py_UNUSED(closure)) { return PyLong_FromUnsignedLong(c->live); }

static PyGetSetDef GETSET[] = {
    {"entries", (getter)core_get_entries, NULL, "(worker, block) entries in all", NULL},
    {"holes", (getter)core_get_holes, NULL, "hole entries over all workers (0: the fast path)", NULL},
    {"nodes", (getter)core_get_nodes, NULL, "nodes in the tree, the root not counted", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef CORE_METHODS[] = {
    {"store", (PyCFunction)core_store, METH_VARARGS, "Apply a Stored event; the status's number."},
    {"remove", (PyCFunction)core_remove, METH_VARARGS, "Apply a Removed event; the status's number."},
    {"clear", (PyCFunction)core_clear, METH_VARARGS, "Drop every block of one worker id."},
    {"add_worker", (PyCFunction)core_add_worker, METH_VARARGS, "Make a worker id known."},
    {"drop_worker", (PyCFunction)core_drop_worker, METH_VARARGS, "Forget a cleared worker id."},
    {"scores", (PyCFunction)core_scores, METH_VARARGS, "Matched depth per worker key."},
    {"pieces", (PyCFunction)core_pieces, METH_O, "The answer as (depth, bitmask) pieces, or None."},
    {"dump", (PyCFunction)core_dump, METH_NOARGS, "Every reachable entry, breadth first."},
    {"held", (PyCFunction)core_held, METH_VARARGS, "Blocks one worker id holds."},
    {"block_hash_of", (PyCFunction)core_block_hash_of, METH_VARARGS, "A worker's name for a node."},
    {"depth", (PyCFunction)core_depth, METH_O, "A node's depth, 0 when absent."},
    {"depth_histogram", (PyCFunction)core_depth_histogram, METH_NOARGS, "Depth -> nodes."},
    {"hole_counts", (PyCFunction)core_hole_counts, METH_NOARGS, "(wid, node) -> children held."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CORE_TYPE = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dyn.core.kv._radix.RadixCore",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The prefix index's tree over worker ids (see dyn.core.kv.indexer_c).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)core_init,
    .tp_dealloc = (destructor)core_dealloc,
    .tp_methods = CORE_METHODS,
    .tp_getset = GETSET,
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_radix", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__radix(void) {
    if (PyType_Ready(&CORE_TYPE) < 0) return NULL;
    PyObject *m = PyModule_Create(&MODULE);
    if (m == NULL) return NULL;
    Py_INCREF(&CORE_TYPE);
    if (PyModule_AddObject(m, "RadixCore", (PyObject *)&CORE_TYPE) < 0) {
        Py_DECREF(&CORE_TYPE);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
