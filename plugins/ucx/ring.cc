// The pipelined ring: reduce-scatter and all-gather steps over tag messages or
// the shared-memory mailboxes.
#include "algorithms.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace dtrain::ucx_backend {

void copy_streaming(char* dst, const char* src, size_t len) {
  size_t i = 0;
#if defined(__SSE2__)
  if ((reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
    for (; i + 64 <= len; i += 64) {
      __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
      __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
      __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
    }
    _mm_sfence();
  }
#endif
  if (i < len) std::memcpy(dst + i, src + i, len - i);
}

void Algorithms::ring_reduce_scatter(const void* src, void* dst, void* final_dst, size_t count, int32_t dtype,
                                     int32_t op, uint64_t seq, Clock::time_point deadline, bool stream) {
  size_t esz = sdk::dtype_size(dtype);
  sdk::ReduceFn fn = sdk::reduce_fn(dtype, op);
  int r = rank(), next = wrap(r + 1), prev = wrap(r - 1);
  size_t chunk = std::max<size_t>(1, settings.chunk_bytes / esz);
  int depth = std::max(1, settings.depth);
  char* slots = grow(chunks_, chunk * esz * depth);
  for (int step = 0; step < world() - 1; ++step) {
    int sb = wrap(r - 1 - step), rb = wrap(r - 2 - step);
    const char* sptr = at(step == 0 ? src : dst, block_off(count, sb) * esz);
    size_t slen = block_len(count, sb);
    size_t roff = block_off(count, rb), rlen = block_len(count, rb);
    char* out = (step == world() - 2 && final_dst) ? static_cast<char*>(final_dst) : at(dst, roff * esz);
    const char* mine = at(src, roff * esz);
    if (shm_ok(count * esz)) {
      shm_step(
          sptr, slen * esz, rlen * esz, chunk * esz,
          [&](size_t k, const char* data, size_t bytes) {
            fn(out + k * chunk * esz, mine + k * chunk * esz, data, bytes / esz);
          },
          deadline, "ring reduce-scatter", stream);
      continue;
    }
    Batch sends(fabric());
    for (size_t o = 0; o < slen; o += chunk)
      sends.add(fabric().isend(next, Fabric::coll_tag(r, seq), sptr + o * esz, std::min(chunk, slen - o) * esz));
    size_t nchunks = (rlen + chunk - 1) / chunk;
    Batch recvs(fabric());
    recvs.reqs.reserve(depth);
    auto post = [&](size_t k) {
      size_t len = std::min(chunk, rlen - k * chunk);
      return fabric().irecv(prev, Fabric::coll_tag(prev, seq), slots + (k % depth) * chunk * esz, len * esz);
    };
    for (size_t k = 0; k < nchunks && k < static_cast<size_t>(depth); ++k) recvs.add(post(k));
    for (size_t k = 0; k < nchunks; ++k) {
      Request& slot = recvs.reqs[k % depth];
      fabric().wait(slot, deadline, "ring reduce-scatter");
      size_t len = std::min(chunk, rlen - k * chunk);
      fn(out + k * chunk * esz, mine + k * chunk * esz, slots + (k % depth) * chunk * esz, len);
      if (k + depth < nchunks) slot = post(k + depth);
    }
    sends.wait(deadline, "ring reduce-scatter");
  }
}

void Algorithms::ring_allgather(void* buf, size_t count, size_t esz, uint64_t seq, Clock::time_point deadline,
                                bool stream) {
  int r = rank(), next = wrap(r + 1), prev = wrap(r - 1);
  size_t chunk = std::max<size_t>(esz, settings.chunk_bytes / esz * esz);
  for (int step = 0; step < world() - 1; ++step) {
    int sb = wrap(r - step), rb = wrap(r - step - 1);
    if (shm_ok(count * esz)) {
      char* dst = at(buf, block_off(count, rb) * esz);
      shm_step(
          at(buf, block_off(count, sb) * esz), block_len(count, sb) * esz, block_len(count, rb) * esz, chunk,
          [&](size_t k, const char* data, size_t bytes) { std::memcpy(dst + k * chunk, data, bytes); }, deadline,
          "ring all-gather", stream);
      continue;
    }
    Batch b(fabric());
    b.add(fabric().irecv(prev, Fabric::coll_tag(prev, seq), at(buf, block_off(count, rb) * esz),
                         block_len(count, rb) * esz));
    b.add(fabric().isend(next, Fabric::coll_tag(r, seq), at(buf, block_off(count, sb) * esz),
                         block_len(count, sb) * esz));
    b.wait(deadline, "ring all-gather");
  }
}

}  // namespace dtrain::ucx_backend
