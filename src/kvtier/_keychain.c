/* Chained, keyed BLAKE3 for kvtier's chunk keys (see kvtier/keyhash.py for the contract).
 *
 * Why native: a chain is sequential, so Python pays one hash call per chunk (about 1 us
 * with the blake3 package: 8 ms for a 128k-token request in 16-token chunks); here the
 * whole chain is one call. The output is byte-identical to the blake3 package's keyed mode
 * over the same messages (tests/test_keys.py checks it), so both paths give the same keys.
 *
 * kvt_keys (the scheduler's path) goes further: token ids (a Python list) to the list of
 * chunk keys in one call, loaded with ctypes.PyDLL so it runs holding the GIL; it releases
 * the GIL while it hashes.
 *
 * This is a plain, portable implementation of the BLAKE3 specification (one compression at
 * a time, no SIMD): chunk keys hash a few hundred bytes per chunk, where the many-chunk
 * SIMD paths of a full library do not apply.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { BLOCK = 64, CHUNK = 1024, CV_BYTES = 32, MAX_DEPTH = 54 };
enum { CHUNK_START = 1, CHUNK_END = 2, PARENT = 4, ROOT = 8, KEYED_HASH = 16 };

static const uint32_t IV[4] = {0x6A09E667u, 0xBB67AE85u, 0x3C6EF372u, 0xA54FF53Au};
/* Message word order of each of the 7 rounds: the specification's permutation applied r times. */
static const uint8_t SCHED[7][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8},
    {3, 4, 10, 12, 13, 2, 7, 14, 6, 5, 9, 0, 11, 15, 8, 1},
    {10, 7, 12, 9, 14, 3, 13, 15, 4, 0, 11, 2, 5, 8, 1, 6},
    {12, 13, 9, 11, 15, 10, 14, 8, 7, 2, 5, 3, 0, 1, 6, 4},
    {9, 14, 11, 5, 8, 12, 15, 1, 13, 3, 0, 10, 2, 6, 4, 7},
    {11, 15, 5, 0, 1, 9, 8, 6, 14, 10, 2, 12, 3, 4, 7, 13},
};

static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static uint32_t load32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void store32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
}

#define G(a, b, c, d, x, y)                                                                    \
    do {                                                                                       \
        v[a] += v[b] + (x), v[d] = rotr(v[d] ^ v[a], 16), v[c] += v[d];                          \
        v[b] = rotr(v[b] ^ v[c], 12), v[a] += v[b] + (y), v[d] = rotr(v[d] ^ v[a], 8);           \
        v[c] += v[d], v[b] = rotr(v[b] ^ v[c], 7);                                             \
    } while (0)

/* One compression; cv becomes the first 8 words of its output (the chaining value). */
static void compress(uint32_t cv[8], const uint8_t block[BLOCK], uint64_t counter,
                     uint32_t len, uint32_t flags) {
    uint32_t m[16], v[16];
    for (int i = 0; i < 16; i++) m[i] = load32(block + 4 * i);
    for (int i = 0; i < 8; i++) v[i] = cv[i];
    for (int i = 0; i < 4; i++) v[8 + i] = IV[i];
    v[12] = (uint32_t)counter, v[13] = (uint32_t)(counter >> 32), v[14] = len, v[15] = flags;
    /* Unrolled, the schedule's indexes are constants: about 15% off a compression. */
#pragma GCC unroll 7
    for (int r = 0; r < 7; r++) {
        const uint8_t *s = SCHED[r];
        G(0, 4, 8, 12, m[s[0]], m[s[1]]);
        G(1, 5, 9, 13, m[s[2]], m[s[3]]);
        G(2, 6, 10, 14, m[s[4]], m[s[5]]);
        G(3, 7, 11, 15, m[s[6]], m[s[7]]);
        G(0, 5, 10, 15, m[s[8]], m[s[9]]);
        G(1, 6, 11, 12, m[s[10]], m[s[11]]);
        G(2, 7, 8, 13, m[s[12]], m[s[13]]);
        G(3, 4, 9, 14, m[s[14]], m[s[15]]);
    }
    for (int i = 0; i < 8; i++) cv[i] = v[i] ^ v[i + 8];
}

/* The chaining value of one chunk (at most CHUNK bytes), ROOT added to its last block when
 * `root`. */
static void chunk_cv(const uint32_t key[8], const uint8_t *p, size_t len, uint64_t index,
                     uint32_t flags, int root, uint32_t out[8]) {
    uint8_t block[BLOCK];
    memcpy(out, key, 32);
    size_t off = 0;
    do {
        size_t n = len - off < BLOCK ? len - off : BLOCK;
        uint32_t f = flags | (off == 0 ? CHUNK_START : 0);
        if (off + n == len) f |= CHUNK_END | (root ? ROOT : 0);
        memset(block, 0, BLOCK);
        memcpy(block, p + off, n);
        compress(out, block, index, (uint32_t)n, f);
        off += n;
    } while (off < len);
}

static void parent_cv(const uint32_t key[8], const uint32_t l[8], const uint32_t r[8],
                      uint32_t flags, uint32_t out[8]) {
    uint8_t block[BLOCK];
    for (int i = 0; i < 8; i++) store32(block + 4 * i, l[i]), store32(block + 32 + 4 * i, r[i]);
    memcpy(out, key, 32);
    compress(out, block, 0, BLOCK, flags | PARENT);
}

/* BLAKE3(key, p[0:len]) with a 32-byte output: keyed mode when flags has KEYED_HASH. */
static void hash32(const uint32_t key[8], uint32_t flags, const uint8_t *p, size_t len,
                   uint8_t out[CV_BYTES]) {
    uint32_t stack[MAX_DEPTH][8], cv[8];
    int depth = 0;
    uint64_t chunks = len ? (len - 1) / CHUNK + 1 : 1;
    for (uint64_t c = 0; c + 1 < chunks; c++) {
        chunk_cv(key, p + c * CHUNK, CHUNK, c, flags, 0, cv);
        for (uint64_t total = c + 1; !(total & 1); total >>= 1)
            parent_cv(key, stack[--depth], cv, flags, cv);
        memcpy(stack[depth++], cv, 32);
    }
    size_t last = (size_t)((chunks - 1) * CHUNK);
    chunk_cv(key, p + last, len - last, chunks - 1, flags, depth == 0, cv);
    while (depth > 0) {
        depth--;
        parent_cv(key, stack[depth], cv, flags | (depth == 0 ? ROOT : 0), cv);
    }
    for (int i = 0; i < 8; i++) store32(out + 4 * i, cv[i]);
}

/* The chain: out[i] = BLAKE3(key, out[i-1] || extras[i] || data[i]), out[-1] = seed, where
 * data[i] is the i-th `step`-byte piece of `data` and extras[i] 32 bytes (zeros when
 * `extras` is NULL). `out` holds n * 32 bytes. Returns 0, or -1 when out of memory. */
int kvt_chain(const uint8_t key_bytes[32], const uint8_t seed[CV_BYTES], int64_t n,
              int64_t step, const uint8_t *data, const uint8_t *extras, uint8_t *out) {
    uint32_t key[8];
    for (int i = 0; i < 8; i++) key[i] = load32(key_bytes + 4 * i);
    size_t len = 2 * CV_BYTES + (size_t)step;
    uint8_t *msg = malloc(len);
    if (!msg) return -1;
    const uint8_t *prev = seed;
    for (int64_t i = 0; i < n; i++) {
        memcpy(msg, prev, CV_BYTES);
        if (extras)
            memcpy(msg + CV_BYTES, extras + i * CV_BYTES, CV_BYTES);
        else
            memset(msg + CV_BYTES, 0, CV_BYTES);
        memcpy(msg + 2 * CV_BYTES, data + i * step, (size_t)step);
        hash32(key, KEYED_HASH, msg, len, out + i * CV_BYTES);
        prev = out + i * CV_BYTES;
    }
    free(msg);
    return 0;
}

enum { KEY_BYTES = 20, TAG_BYTES = 4, GROUP_CHUNKS = 16 };

/* A token id as 4 little-endian bytes; -1 with a Python exception (not an int, out of
 * [0, 2**32)). */
static int token_le32(PyObject *item, uint8_t *out) {
    unsigned long v;
    if (PyLong_Check(item)) {
        v = PyLong_AsUnsignedLong(item);
    } else {
        PyObject *i = PyNumber_Index(item);
        if (!i) return -1;
        v = PyLong_AsUnsignedLong(i);
        Py_DECREF(i);
    }
    if (v == (unsigned long)-1 && PyErr_Occurred()) return -1;
    if (v > 0xFFFFFFFFul) {
        PyErr_SetString(PyExc_OverflowError, "token id does not fit 32 bits");
        return -1;
    }
    store32(out, (uint32_t)v);
    return 0;
}

/* The chunk keys of chunks base .. base + n - 1 of a chain (kvtier/keys.py's docstring),
 * from `tokens[start : start + n * chunk]` (a list of ints): a new list of n bytes objects
 * of KEY_BYTES, or NULL with an exception set. `last` (32 bytes) holds d(base - 1) and
 * becomes d(base + n - 1); `extras`: n * 32 bytes or NULL (zeros); `tag`: the group tag of
 * chunk base when its group began before it (base % GROUP_CHUNKS != 0), else ignored. */
PyObject *kvt_keys(PyObject *tokens, Py_ssize_t start, Py_ssize_t n, Py_ssize_t chunk,
                   const uint8_t key_bytes[32], uint8_t last[CV_BYTES], const uint8_t *extras,
                   const uint8_t *tag, Py_ssize_t base) {
    if (!PyList_Check(tokens) || n < 0 || chunk <= 0 || start < 0 ||
        start + n * chunk > PyList_GET_SIZE(tokens)) {
        PyErr_SetString(PyExc_ValueError, "kvt_keys: tokens must be a list covering the chunks");
        return NULL;
    }
    size_t step = (size_t)chunk * 4, count = (size_t)n;
    uint8_t *data = malloc(count * step + 1), *dig = malloc(count * CV_BYTES + 1);
    if (!data || !dig) {
        free(data), free(dig);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n * chunk; i++) {
        if (token_le32(PyList_GET_ITEM(tokens, start + i), data + 4 * i) < 0) {
            free(data), free(dig);
            return NULL;
        }
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvt_chain(key_bytes, last, n, (int64_t)step, data, extras, dig);
    Py_END_ALLOW_THREADS
    free(data);
    PyObject *out = rc == 0 ? PyList_New(n) : PyErr_NoMemory();
    if (!out) {
        free(dig);
        return NULL;
    }
    uint8_t cur[TAG_BYTES] = {0};
    if (tag) memcpy(cur, tag, TAG_BYTES);
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint8_t *d = dig + (size_t)i * CV_BYTES;
        if ((base + i) % GROUP_CHUNKS == 0 || (i == 0 && !tag)) memcpy(cur, d, TAG_BYTES);
        PyObject *k = PyBytes_FromStringAndSize(NULL, KEY_BYTES);
        if (!k) {
            Py_DECREF(out), free(dig);
            return NULL;
        }
        memcpy(PyBytes_AS_STRING(k), cur, TAG_BYTES);
        memcpy(PyBytes_AS_STRING(k) + TAG_BYTES, d + TAG_BYTES, KEY_BYTES - TAG_BYTES);
        PyList_SET_ITEM(out, i, k);
    }
    if (n > 0) memcpy(last, dig + (count - 1) * CV_BYTES, CV_BYTES);
    free(dig);
    return out;
}
