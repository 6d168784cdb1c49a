/* Native data path of the disk tier: payload I/O fused with the payload checksum.
 *
 * Loaded with ctypes by kvtier.tiers.disk.native (never imported as a Python module), so every
 * call runs without the GIL. The hash functions are not linked: kvt_init receives the
 * addresses of xxHash's XXH3 functions from the xxhash package kvtier already depends on,
 * so this file and the Python path compute the same checksums by construction.
 *
 * Why native: per-chunk Python costs about as much as moving a 64 KiB chunk. Each chunk
 * moves in pieces of at most PIECE bytes, hashed right before (writes) or right after
 * (reads) the syscall that moves them, while they are in cache, so the checksum pass never
 * goes back to main memory, however large the chunk.
 *
 * Contract of both entry points: chunk i is the byte range covered, in order, by the
 * buffers iov_ptr/iov_len[iov_start[i] .. iov_start[i+1]) and lives in file fds[i] at
 * offs[i]. status[i] is 0 on success, 1 for an I/O error or a short transfer (errno is
 * not kept: the caller only counts), 2 for a checksum mismatch (reads). Failures are per
 * chunk; the calls themselves never fail once kvt_init succeeded. Buffers are borrowed for
 * the call. Thread-safe: no shared state besides the function table set once by kvt_init.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef PIECE
#define PIECE (128 * 1024) /* bytes per syscall: stays in L2 until hashed */
#endif
#define MAX_IOV 64         /* buffers per syscall, far below IOV_MAX */
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

static const unsigned char zeros[4096];

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

/* Cursor over one chunk's buffers, handing out pieces of at most PIECE bytes. */
typedef struct {
    const uint64_t *ptr, *len;
    int64_t j, end;
    uint64_t in; /* bytes of buffer j already handed out */
} cursor;

static int next_piece(cursor *c, struct iovec *iov, size_t *bytes) {
    int cnt = 0;
    size_t got = 0;
    while (c->j < c->end && cnt < MAX_IOV && got < PIECE) {
        uint64_t left = c->len[c->j] - c->in;
        size_t m = left < PIECE - got ? (size_t)left : PIECE - got;
        if (m) {
            iov[cnt].iov_base = (char *)(uintptr_t)c->ptr[c->j] + c->in;
            iov[cnt].iov_len = m;
            cnt++;
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

static void hash_piece(void *st, const struct iovec *iov, int cnt) {
    for (int k = 0; k < cnt; k++) xx.update(st, iov[k].iov_base, iov[k].iov_len);
}

static void put_u64(unsigned char *p, uint64_t v) {
    for (int k = 0; k < 8; k++) p[k] = (unsigned char)(v >> (8 * k));
}

/* Read chunks and verify each against sums[i], hashing with seed seeds[i]. */
int kvt_read(int64_t n, const int32_t *fds, const int64_t *offs, const int64_t *iov_start,
             const uint64_t *iov_ptr, const uint64_t *iov_len, const uint64_t *seeds,
             const uint64_t *sums, uint8_t *status) {
    void *st = xx.create();
    if (!st) return -1;
    struct iovec iov[MAX_IOV];
    for (int64_t i = 0; i < n; i++) {
        cursor c = {iov_ptr, iov_len, iov_start[i], iov_start[i + 1], 0};
        off_t off = (off_t)offs[i];
        uint8_t s = 0;
        xx.reset(st, seeds[i]);
        for (;;) {
            size_t bytes;
            int cnt = next_piece(&c, iov, &bytes);
            if (!cnt) break;
            if (move_all(0, fds[i], iov, cnt, off, bytes)) {
                s = 1;
                break;
            }
            hash_piece(st, iov, cnt);
            off += (off_t)bytes;
        }
        if (!s && xx.digest(st) != sums[i]) s = 2;
        status[i] = s;
    }
    xx.free(st);
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
    if (pad > sizeof zeros) return -1;
    void *st = xx.create();
    if (!st) return -1;
    struct iovec iov[MAX_IOV + 1];
    for (int64_t i = 0; i < n; i++) {
        cursor c = {iov_ptr, iov_len, iov_start[i], iov_start[i + 1], 0};
        off_t off = (off_t)offs[i];
        uint8_t s = 0;
        xx.reset(st, seeds[i]);
        for (;;) {
            size_t bytes;
            int cnt = next_piece(&c, iov, &bytes);
            if (!cnt) break;
            hash_piece(st, iov, cnt);
            int wcnt = cnt;
            size_t wbytes = bytes;
            if (c.j == c.end && pad) { /* the last piece carries the padding */
                iov[wcnt].iov_base = (void *)zeros;
                iov[wcnt].iov_len = (size_t)pad;
                wcnt++;
                wbytes += (size_t)pad;
            }
            if (move_all(1, fds[i], iov, wcnt, off, wbytes)) {
                s = 1;
                break;
            }
            off += (off_t)bytes;
        }
        unsigned char *h = headers + i * HEADER_BYTES;
        if (s) {
            memset(h, 0, HEADER_BYTES);
            sums[i] = 0;
        } else {
            sums[i] = xx.digest(st);
            put_u64(h + PSUM_AT, sums[i]);
            put_u64(h + HSUM_AT, xx.hash(h, HSUM_AT, 0));
        }
        status[i] = s;
    }
    xx.free(st);
    for (int64_t i = 0; i < n;) {
        int64_t k = i + 1;
        while (k < n && fds[k] == fds[i] && hdr_offs[k] == hdr_offs[k - 1] + HEADER_BYTES) k++;
        size_t len = (size_t)(k - i) * HEADER_BYTES;
        struct iovec v = {headers + i * HEADER_BYTES, len};
        if (move_all(1, fds[i], &v, 1, (off_t)hdr_offs[i], len))
            for (int64_t m = i; m < k; m++) status[m] = 1;
        i = k;
    }
    return 0;
}
