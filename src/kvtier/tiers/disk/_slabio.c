/* Native data path of the disk tier: payload I/O fused with the payload checksum.
 *
 * Loaded with ctypes by kvtier.tiers.disk.native (never imported as a Python module), so every
 * call runs without the GIL. The hash functions are not linked: kvt_init receives the
 * addresses of xxHash's XXH3 functions from the xxhash package kvtier already depends on,
 * so this file and the Python path compute the same checksums by construction.
 *
 * Why native: per-chunk Python costs about as much as moving a 64 KiB chunk. Bytes move in
 * pieces of at most READ_PIECE / WRITE_PIECE, hashed right after (reads) or right before
 * (writes) the syscall that moves them, while they are in cache, so the checksum pass never
 * goes back to main memory, however large the chunk. Chunks that lie back to back in one
 * file (consecutive slots) share a piece: one syscall moves several small chunks, and the
 * stride padding between them goes to a discard buffer (reads) or comes from zeros
 * (writes). Buffers that are adjacent in memory (consecutive engine blocks of one layer)
 * go to the kernel as one.
 *
 * Why these piece sizes (benchmarks/disk_tier.py, and a C loop of the same syscalls, on a
 * Zen 4 with 1 MiB of L2 per core): every syscall on a file has a fixed cost (~0.7 us per
 * read, several us per buffered write on ext4, which walks the page-cache folio's buffer
 * heads and may dirty the inode), and a write's size also sets the size of the page-cache
 * folios it creates, which later reads pay per folio. 128 KiB pieces cost loads ~10% and
 * stores ~25-35% against one syscall per 4 MiB chunk; 512 KiB reads and 1 MiB writes are
 * within a few percent of it and still hash from L2 (or the L3 victim cache).
 *
 * Contract of both entry points: chunk i is the byte range covered, in order, by the
 * buffers iov_ptr/iov_len[iov_start[i] .. iov_start[i+1]) and lives in file fds[i] at
 * offs[i]; `pad` bytes of stride padding follow every payload in the file. status[i] is 0
 * on success, 1 for an I/O error or a short transfer (errno is not kept: the caller only
 * counts), 2 for a checksum mismatch (reads). Failures are per chunk: a shared piece that
 * fails is redone chunk by chunk. The calls themselves never fail once kvt_init succeeded
 * (and pad < 4096). Buffers are borrowed for the call. Thread-safe: no shared state
 * besides the function table set once by kvt_init.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef READ_PIECE
#define READ_PIECE (512 * 1024) /* bytes per read syscall: hashed from L2 right after */
#endif
#ifndef WRITE_PIECE
#define WRITE_PIECE (1024 * 1024) /* bytes per write syscall: hashed right before */
#endif
#define MAX_IOV 64         /* buffers per syscall, far below IOV_MAX */
#define MAX_PAD 4096       /* payloads are page aligned: padding is under a page */
#define HEADER_BYTES 128
#define PSUM_AT 24         /* payload checksum field of a slot header */
#define HSUM_AT 120        /* header checksum field: XXH3 of the bytes before it */

typedef void *(*create_fn)(void);
typedef int (*free_fn)(void *);
typedef int (*reset_fn)(void *, uint64_t);
typedef int (*update_fn)(void *, const void *, size_t);
typedef uint64_t (*digest_fn)(const void *);
typedef uint64_t (*hash_fn)(const void *, size_t, uint64_t);

static struct {
    create_fn create;
    free_fn free;
    reset_fn reset;
    update_fn update;
    digest_fn digest;
    hash_fn hash;
} xx;

static const unsigned char zeros[MAX_PAD];

int kvt_init(void *create, void *free_, void *reset, void *update, void *digest, void *hash) {
    if (!create || !free_ || !reset || !update || !digest || !hash) return -1;
    xx.create = (create_fn)create;
    xx.free = (free_fn)free_;
    xx.reset = (reset_fn)reset;
    xx.update = (update_fn)update;
    xx.digest = (digest_fn)digest;
    xx.hash = (hash_fn)hash;
    return 0;
}

/* Move `total` bytes between `iov` and the file at `off`, repeating after short transfers
 * and EINTR. Works on a copy of the buffer list (the caller hashes the original). */
static int move_all(int write, int fd, const struct iovec *iov, int cnt, off_t off, size_t total) {
    struct iovec v[MAX_IOV + 1];
    memcpy(v, iov, (size_t)cnt * sizeof *v);
    struct iovec *p = v;
    size_t done = 0;
    while (done < total) {
        ssize_t n = write ? pwritev(fd, p, cnt, off + (off_t)done) : preadv(fd, p, cnt, off + (off_t)done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1; /* error, or end of file on a truncated slab */
        done += (size_t)n;
        while (cnt > 0 && (size_t)n >= p->iov_len) {
            n -= (ssize_t)p->iov_len;
            p++;
            cnt--;
        }
        if (cnt > 0 && n > 0) {
            p->iov_base = (char *)p->iov_base + n;
            p->iov_len -= (size_t)n;
        }
    }
    return 0;
}

/* One call's arrays (see the contract above). */
typedef struct {
    const int32_t *fds;
    const int64_t *offs;
    const int64_t *start;
    const uint64_t *ptr, *len;
    uint64_t pad;
} batch;

/* Cursor over one chunk's buffers, handing out pieces of at most `piece` bytes. */
typedef struct {
    const uint64_t *ptr, *len;
    int64_t j, end;
    uint64_t in; /* bytes of buffer j already handed out */
} cursor;

static int next_piece(cursor *c, struct iovec *iov, size_t *bytes, size_t piece) {
    int cnt = 0;
    size_t got = 0;
    while (c->j < c->end && cnt < MAX_IOV && got < piece) {
        uint64_t left = c->len[c->j] - c->in;
        size_t m = left < piece - got ? (size_t)left : piece - got;
        if (m) {
            char *base = (char *)(uintptr_t)c->ptr[c->j] + c->in;
            if (cnt && (char *)iov[cnt - 1].iov_base + iov[cnt - 1].iov_len == base)
                iov[cnt - 1].iov_len += m; /* adjacent in memory: one buffer */
            else {
                iov[cnt].iov_base = base;
                iov[cnt++].iov_len = m;
            }
            got += m;
        }
        c->in += m;
        if (c->in == c->len[c->j]) {
            c->j++;
            c->in = 0;
        }
    }
    *bytes = got;
    return cnt;
}

/* Bytes from file offset `off` to the next multiple of `piece` (a power of two). Pieces
 * end on those multiples: a write creates page-cache folios only as large as its aligned
 * spans, so slab payloads, which start at the end of the header area (only page aligned),
 * would otherwise get small folios at every piece boundary, and every later read of them
 * pays per folio. */
static size_t to_boundary(off_t off, size_t piece) {
    return piece - (size_t)((uint64_t)off & (piece - 1));
}

static void hash_piece(void *st, const struct iovec *iov, int cnt) {
    for (int k = 0; k < cnt; k++) xx.update(st, iov[k].iov_base, iov[k].iov_len);
}

/* XXH3 of chunk i's buffers, seeded. */
static uint64_t hash_chunk(void *st, const batch *b, int64_t i, uint64_t seed) {
    int64_t a = b->start[i], e = b->start[i + 1];
    if (e - a == 1) return xx.hash((const void *)(uintptr_t)b->ptr[a], (size_t)b->len[a], seed);
    xx.reset(st, seed);
    for (int64_t j = a; j < e; j++) xx.update(st, (const void *)(uintptr_t)b->ptr[j], (size_t)b->len[j]);
    return xx.digest(st);
}

static uint64_t chunk_bytes(const batch *b, int64_t i) {
    uint64_t n = 0;
    for (int64_t j = b->start[i]; j < b->start[i + 1]; j++) n += b->len[j];
    return n;
}

/* Whether a buffer of chunk k overlaps one of chunks i .. k-1 (a read's skipped ranges
 * all land in one scratch buffer: two chunks sharing a syscall would overwrite each
 * other's before they are hashed). */
static int overlaps(const batch *b, int64_t i, int64_t k) {
    for (int64_t j = b->start[k]; j < b->start[k + 1]; j++) {
        uint64_t lo = b->ptr[j], hi = lo + b->len[j];
        for (int64_t q = b->start[i]; q < b->start[k]; q++)
            if (lo < b->ptr[q] + b->len[q] && b->ptr[q] < hi) return 1;
    }
    return 0;
}

/* The group of chunks starting at i that share one syscall: back to back in one file, of
 * equal size, at most `piece` bytes (padding between them included; not past the next
 * multiple of `piece` in the file once it holds two chunks) and MAX_IOV buffers
 * (padding after each included) in all, and, for reads (`distinct`), no two with
 * overlapping buffers. Returns its end (exclusive); *shared is 0 when chunk i alone is
 * too large, which then moves in pieces (read_chunk / write_chunk). */
static int64_t group_end(const batch *b, int64_t i, int64_t n, size_t piece, int distinct,
                         int *shared) {
    uint64_t bytes = chunk_bytes(b, i);
    int64_t nbufs = b->start[i + 1] - b->start[i] + 1;
    *shared = bytes <= piece && nbufs <= MAX_IOV;
    if (!*shared) return i + 1;
    uint64_t stride = bytes + b->pad, span = bytes;
    uint64_t limit = to_boundary((off_t)b->offs[i], piece); /* groups end on boundaries too */
    int64_t k = i + 1;
    while (k < n && b->fds[k] == b->fds[i] && b->offs[k] == b->offs[k - 1] + (int64_t)stride) {
        int64_t more = b->start[k + 1] - b->start[k] + 1;
        if (chunk_bytes(b, k) != bytes || span + stride + b->pad > limit || nbufs + more > MAX_IOV)
            break;
        if (distinct && overlaps(b, i, k)) break;
        span += stride;
        nbufs += more;
        k++;
    }
    return k;
}

/* Fill `v` with chunks i .. k-1 and the padding between (and, with `tail`, after) them. */
static int group_iov(const batch *b, int64_t i, int64_t k, void *padbuf, int tail,
                     struct iovec *v, size_t *total) {
    int cnt = 0;
    size_t t = 0;
    for (int64_t m = i; m < k; m++) {
        if (m > i && b->pad) {
            v[cnt].iov_base = padbuf;
            v[cnt++].iov_len = (size_t)b->pad;
            t += (size_t)b->pad;
        }
        for (int64_t j = b->start[m]; j < b->start[m + 1]; j++) {
            if (!b->len[j]) continue;
            char *base = (char *)(uintptr_t)b->ptr[j];
            if (cnt && (char *)v[cnt - 1].iov_base + v[cnt - 1].iov_len == base)
                v[cnt - 1].iov_len += (size_t)b->len[j]; /* adjacent in memory */
            else {
                v[cnt].iov_base = base;
                v[cnt++].iov_len = (size_t)b->len[j];
            }
            t += (size_t)b->len[j];
        }
    }
    if (tail && b->pad) {
        v[cnt].iov_base = padbuf;
        v[cnt++].iov_len = (size_t)b->pad;
        t += (size_t)b->pad;
    }
    *total = t;
    return cnt;
}

/* Read chunk i alone, in pieces, hashing each piece after it arrives; its status. */
static uint8_t read_chunk(void *st, const batch *b, int64_t i, uint64_t seed, uint64_t sum) {
    struct iovec iov[MAX_IOV];
    cursor c = {b->ptr, b->len, b->start[i], b->start[i + 1], 0};
    off_t off = (off_t)b->offs[i];
    xx.reset(st, seed);
    for (;;) {
        size_t bytes;
        int cnt = next_piece(&c, iov, &bytes, to_boundary(off, READ_PIECE));
        if (!cnt) break;
        if (move_all(0, b->fds[i], iov, cnt, off, bytes)) return 1;
        hash_piece(st, iov, cnt);
        off += (off_t)bytes;
    }
    return xx.digest(st) == sum ? 0 : 2;
}

/* Read chunks and verify each against sums[i], hashing with seed seeds[i]. */
int kvt_read(int64_t n, const int32_t *fds, const int64_t *offs, const int64_t *iov_start,
             const uint64_t *iov_ptr, const uint64_t *iov_len, uint64_t pad,
             const uint64_t *seeds, const uint64_t *sums, uint8_t *status) {
    if (pad >= MAX_PAD) return -1;
    void *st = xx.create();
    if (!st) return -1;
    unsigned char discard[MAX_PAD]; /* the padding between two payloads lands here */
    batch b = {fds, offs, iov_start, iov_ptr, iov_len, pad};
    struct iovec v[MAX_IOV];
    for (int64_t i = 0; i < n;) {
        int grouped;
        int64_t k = group_end(&b, i, n, READ_PIECE, 1, &grouped);
        if (grouped) {
            size_t total;
            int cnt = group_iov(&b, i, k, discard, 0, v, &total);
            grouped = cnt == 0 || !move_all(0, fds[i], v, cnt, (off_t)offs[i], total);
        }
        for (int64_t m = i; m < k; m++) {
            if (grouped)
                status[m] = hash_chunk(st, &b, m, seeds[m]) == sums[m] ? 0 : 2;
            else /* too large to share a syscall, or the shared one failed: per chunk */
                status[m] = read_chunk(st, &b, m, seeds[m], sums[m]);
        }
        i = k;
    }
    xx.free(st);
    return 0;
}

static void put_u64(unsigned char *p, uint64_t v) {
    for (int k = 0; k < 8; k++) p[k] = (unsigned char)(v >> (8 * k));
}

/* Write chunk i alone (plus its padding), in pieces, hashing each piece before it goes;
 * its status, and its payload checksum in *sum. */
static uint8_t write_chunk(void *st, const batch *b, int64_t i, uint64_t seed, uint64_t *sum) {
    struct iovec iov[MAX_IOV + 1];
    cursor c = {b->ptr, b->len, b->start[i], b->start[i + 1], 0};
    off_t off = (off_t)b->offs[i];
    xx.reset(st, seed);
    for (;;) {
        size_t bytes;
        int cnt = next_piece(&c, iov, &bytes, to_boundary(off, WRITE_PIECE));
        if (!cnt) break;
        hash_piece(st, iov, cnt);
        int wcnt = cnt;
        size_t wbytes = bytes;
        if (c.j == c.end && b->pad) { /* the last piece carries the padding */
            iov[wcnt].iov_base = (void *)zeros;
            iov[wcnt].iov_len = (size_t)b->pad;
            wcnt++;
            wbytes += (size_t)b->pad;
        }
        if (move_all(1, b->fds[i], iov, wcnt, off, wbytes)) return 1;
        off += (off_t)bytes;
    }
    *sum = xx.digest(st);
    return 0;
}

/* Write chunks (each followed by `pad` zero bytes, so whole pages are written), then their
 * headers. headers holds n prepared HEADER_BYTES headers; the payload checksum (seed
 * seeds[i]) and the header checksum are filled in here. A chunk whose payload failed gets
 * a zeroed header instead, which erases whatever the slot held. Headers of consecutive
 * chunks that are adjacent in one file go in one pwrite; a payload is always complete
 * before its header is written (see the crash-safety notes in kvtier.tiers.disk). */
int kvt_write(int64_t n, const int32_t *fds, const int64_t *offs, const int64_t *iov_start,
              const uint64_t *iov_ptr, const uint64_t *iov_len, uint64_t pad,
              const uint64_t *seeds, unsigned char *headers, const int64_t *hdr_offs,
              uint64_t *sums, uint8_t *status) {
    if (pad >= MAX_PAD) return -1;
    void *st = xx.create();
    if (!st) return -1;
    batch b = {fds, offs, iov_start, iov_ptr, iov_len, pad};
    struct iovec v[MAX_IOV];
    for (int64_t i = 0; i < n;) {
        int grouped;
        int64_t k = group_end(&b, i, n, WRITE_PIECE, 0, &grouped);
        if (grouped) {
            for (int64_t m = i; m < k; m++) sums[m] = hash_chunk(st, &b, m, seeds[m]);
            size_t total;
            int cnt = group_iov(&b, i, k, (void *)zeros, 1, v, &total);
            grouped = cnt == 0 || !move_all(1, fds[i], v, cnt, (off_t)offs[i], total);
        }
        for (int64_t m = i; m < k; m++)
            /* too large to share a syscall, or the shared one failed: per chunk */
            status[m] = grouped ? 0 : write_chunk(st, &b, m, seeds[m], &sums[m]);
        i = k;
    }
    xx.free(st);
    for (int64_t i = 0; i < n; i++) {
        unsigned char *h = headers + i * HEADER_BYTES;
        if (status[i]) {
            memset(h, 0, HEADER_BYTES);
            sums[i] = 0;
        } else {
            put_u64(h + PSUM_AT, sums[i]);
            put_u64(h + HSUM_AT, xx.hash(h, HSUM_AT, 0));
        }
    }
    for (int64_t i = 0; i < n;) {
        int64_t k = i + 1;
        while (k < n && fds[k] == fds[i] && hdr_offs[k] == hdr_offs[k - 1] + HEADER_BYTES) k++;
        size_t len = (size_t)(k - i) * HEADER_BYTES;
        struct iovec hv = {headers + i * HEADER_BYTES, len};
        if (move_all(1, fds[i], &hv, 1, (off_t)hdr_offs[i], len))
            for (int64_t m = i; m < k; m++) status[m] = 1;
        i = k;
    }
    return 0;
}
