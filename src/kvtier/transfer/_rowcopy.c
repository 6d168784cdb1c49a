/* Batched row copies between an engine's host KV and the CPU tier, with streaming stores.
 *
 * Loaded with ctypes by kvtier.transfer.native (never imported as a Python module), so every
 * call runs without the GIL.
 *
 * Why native: a plain copy (memcpy, torch's index_select, NumPy's fancy indexing) makes the
 * CPU read every destination line into its cache before overwriting it (read for
 * ownership): a 256 MiB store then moves about 512 MiB over the memory bus on the write
 * side alone, and evicts the engine's working set from the shared L3 on its way. Streaming
 * (non-temporal) stores write whole lines straight to memory: 1.4-1.7x the bandwidth of
 * index_select on byte rows of 64 KiB-4 MiB on a Zen 4 core (benchmarks/copy_bandwidth.py),
 * and the copy thread no longer competes with the compute threads for cache. SSE2's
 * streaming store is part of every x86-64 CPU and reaches the same speed as AVX-512's
 * here; other CPUs fall back to memcpy.
 *
 * The price: the destination is not in cache afterwards. That is what a store into the
 * CPU tier wants (nothing reads a stored chunk soon); a load whose rows attention reads
 * next step would read them from memory, which the caller avoids for small copies
 * (kvtier.transfer.copy.STREAM_MIN_BYTES).
 *
 * Contract of both entry points: n rows of row_bytes bytes; row i of the "dense" side is
 * at dense + i * dense_stride, row idx[i] of the "indexed" side at
 * indexed + idx[i] * indexed_stride. Gather copies indexed -> dense, scatter dense ->
 * indexed. Rows must not overlap (the caller's views are distinct rows of distinct
 * tensors). Every byte is copied whatever the alignment (unaligned heads and tails go
 * through memcpy). Buffers are borrowed for the call; no state; thread-safe.
 */
#include <stdint.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>

static void stream_row(uint8_t *d, const uint8_t *s, size_t len) {
  size_t head = (16 - ((uintptr_t)d & 15)) & 15;
  if (head > len)
    head = len;
  memcpy(d, s, head);
  d += head;
  s += head;
  len -= head;
  size_t body = len & ~(size_t)63;
  for (size_t o = 0; o < body; o += 64) {
    __m128i a = _mm_loadu_si128((const __m128i *)(s + o));
    __m128i b = _mm_loadu_si128((const __m128i *)(s + o + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(s + o + 32));
    __m128i e = _mm_loadu_si128((const __m128i *)(s + o + 48));
    _mm_stream_si128((__m128i *)(d + o), a);
    _mm_stream_si128((__m128i *)(d + o + 16), b);
    _mm_stream_si128((__m128i *)(d + o + 32), c);
    _mm_stream_si128((__m128i *)(d + o + 48), e);
  }
  memcpy(d + body, s + body, len - body);
}

static void fence(void) { _mm_sfence(); }
#else
static void stream_row(uint8_t *d, const uint8_t *s, size_t len) { memcpy(d, s, len); }
static void fence(void) {}
#endif

int kvt_streams(void) {
#if defined(__SSE2__)
  return 1;
#else
  return 0;
#endif
}

void kvt_gather_rows(uint8_t *dense, int64_t dense_stride, const uint8_t *indexed,
                     int64_t indexed_stride, const int64_t *idx, int64_t n, int64_t row_bytes) {
  for (int64_t i = 0; i < n; i++) {
    if (i + 1 < n)
      __builtin_prefetch(indexed + idx[i + 1] * indexed_stride);
    stream_row(dense + i * dense_stride, indexed + idx[i] * indexed_stride, (size_t)row_bytes);
  }
  fence(); /* streaming stores are weakly ordered: visible before the caller reports done */
}

void kvt_scatter_rows(uint8_t *indexed, int64_t indexed_stride, const uint8_t *dense,
                      int64_t dense_stride, const int64_t *idx, int64_t n, int64_t row_bytes) {
  for (int64_t i = 0; i < n; i++)
    stream_row(indexed + idx[i] * indexed_stride, dense + i * dense_stride, (size_t)row_bytes);
  fence();
}
