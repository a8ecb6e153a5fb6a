#pragma once
// Activations quantized to int8 for the int8 x int8 projections (int8_linear.h, int8_amx.h):
// blocks of 32 along K, one fp32 scale each (llama.cpp's Q8_0 activations); and the constants
// both kernels share.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "simd.h"

namespace interlock_cpu {

constexpr int64_t kQBlock = 32;      // activations per quantization scale
constexpr int64_t kChunk = 64;       // weights per VNNI dot (two quantization blocks)
constexpr int64_t kLanes = 16;       // int32 lanes of a chunk's VNNI dot (four weights each)
constexpr int64_t kFewRows = 3;      // activation rows that take the VNNI kernels' lane sums (int8_linear.h)
constexpr int64_t kOutBlock = 4;     // output rows per task unit (AVX2, portable)
// Weights stream from L3 or memory (the model is larger than L2): prefetch this far ahead of each
// row's read, into L1, in the AMX machine's one-row kernel (int8_linear.h, few_rows_vnni). Measured there for all of
// SmolLM2's weights at 2 threads (with the fp32-activation kernel before these): 512 B 9.6 ms,
// 1 KB 8.5 ms, 2 KB 6.7 ms, 4 KB 4.3 ms, 8 KB 4.6 ms, 16 KB 6.0 ms.
constexpr int64_t kPrefetch = 4096;
// The plain VNNI kernel (CPUs without AMX) prefetches into L2, further ahead: on Zen 4 (2 threads,
// SmolLM2's decode GEMVs in sequence) an L1 prefetch 4 KB ahead streamed the weights at ~60% of
// a plain read's rate; an L2 prefetch 8 KB ahead at 97-100% (2 KB: 76%, 4 KB: 95%, 16 KB: as 8 KB).
constexpr int64_t kPrefetchL2 = 8192;

// n values of T on 64-byte boundaries, so that a 64-byte load or a tile row is one cache line (a
// vector's heap memory is 16-byte aligned: AMX's tile pass read its B tiles 1.2x slower so, and the
// many-row tile kernel 1.05x). resize keeps the values; assign zeroes them.
template <class T>
class Lines {
 public:
  void resize(int64_t n) { lines_.resize(count(n)); }
  void assign(int64_t n) { lines_.assign(count(n), Line{}); }
  T* data() { return reinterpret_cast<T*>(lines_.data()); }
  const T* data() const { return reinterpret_cast<const T*>(lines_.data()); }

 private:
  struct alignas(64) Line {
    unsigned char bytes[64];
  };
  static size_t count(int64_t n) { return static_cast<size_t>((n * static_cast<int64_t>(sizeof(T)) + 63) / 64); }
  std::vector<Line> lines_;
};

// The activation rows in the form the dots want, per row m: its int8 values in 64-wide chunks c (K
// padded with zeros to whole chunks); one fp32 scale per block of 32, padded with zero scales to
// whole pairs of chunks (4 blocks: the unit of int8_linear.h's lanes); and, for the VNNI kernels, a
// correction per block (-128 * the sum of its 32 values, padded as the scales) and, for one row,
// the scales and corrections of each pair of chunks in the one-row kernel's lane order
// (int8_linear.h, pair_lane).
struct QuantRows {
  int64_t chunks = 0, pairs = 0;
  Lines<int8_t> q;
  std::vector<float> block_scale;
  Lines<float> pair_scale;
  std::vector<int32_t> block_fix;
  Lines<int32_t> pair_fix;

  const int8_t* qs(int64_t m, int64_t c) const { return q.data() + (m * chunks + c) * kChunk; }
  // Row m's block scales and corrections: block b's at [b], 4 * pairs of them.
  const float* scales(int64_t m) const { return block_scale.data() + m * 4 * pairs; }
  const int32_t* block_fixes(int64_t m) const { return block_fix.data() + m * 4 * pairs; }
  // Row m's pair p: 16 lanes each (M <= kFewRows only).
  const float* pair_scales(int64_t m, int64_t p) const { return pair_scale.data() + (m * pairs + p) * 16; }
  const int32_t* pair_fixes(int64_t m, int64_t p) const { return pair_fix.data() + (m * pairs + p) * 16; }
};

// Block scale amax / 127; values round(x * (127 / amax)) to nearest even; a zero block gets scale
// 0 and values 0. kernels/native.py's quantize_activations is the same in torch (fp32 throughout).
inline void quantize_block(const float* v, int8_t* q, float* scale_out) {
  // NaN propagates, as torch's amax does: a NaN activation makes the block's scale NaN, so the row's
  // outputs are NaN and the engine fails that request (std::max drops a NaN, and the int8 value of a
  // NaN is whatever the conversion gives: a finite, wrong row).
  float amax = 0.f;
  for (int64_t i = 0; i < kQBlock; ++i) {
    const float a = std::fabs(v[i]);
    if (a > amax || std::isnan(a)) amax = a;
    if (std::isnan(amax)) break;
  }
  if (std::isnan(amax)) {                      // no int8 value stands for NaN: the scale carries it
    std::fill(q, q + kQBlock, int8_t{0});
    *scale_out = amax;
    return;
  }
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  for (int64_t i = 0; i < kQBlock; ++i) q[i] = static_cast<int8_t>(std::nearbyint(v[i] * inv));
  *scale_out = amax / 127.f;
}

#if defined(INTERLOCK_VNNI)
// The same arithmetic 16 lanes at a time (cvtps_epi32 rounds to nearest even, as nearbyint).
inline void quantize_block_avx512(const float* v, int8_t* q, float* scale_out) {
  const __m512 v0 = _mm512_loadu_ps(v), v1 = _mm512_loadu_ps(v + 16);
  if ((_mm512_cmp_ps_mask(v0, v0, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(v1, v1, _CMP_UNORD_Q)) != 0) {
    quantize_block(v, q, scale_out);             // NaN propagates through the scale, the first NaN's bits
    return;
  }
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
  const __m512 inv = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v0, inv))));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16),
                   _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v1, inv))));
  *scale_out = amax / 127.f;
}
#endif

#if defined(INTERLOCK_AVX2)
// The same arithmetic 8 lanes at a time (cvtps_epi32 rounds to nearest even, as nearbyint). The
// int8 value is the int32's low byte, as the scalar conversion and AVX-512's cvtepi32_epi8 keep it
// (an infinite amax makes a 0 * inf lane NaN, which converts to 0x80000000: low byte 0): masking to
// the byte first makes the unsigned packs below exact, and the permute undoes their lane order.
inline void quantize_block_avx2(const float* v, int8_t* q, float* scale_out) {
  __m256 x[4];
  __m256 amax8 = _mm256_setzero_ps(), unord = _mm256_setzero_ps();
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int i = 0; i < 4; ++i) {
    x[i] = _mm256_loadu_ps(v + 8 * i);
    amax8 = _mm256_max_ps(amax8, _mm256_and_ps(x[i], abs_mask));
    unord = _mm256_or_ps(unord, _mm256_cmp_ps(x[i], x[i], _CMP_UNORD_Q));
  }
  if (!_mm256_testz_ps(unord, unord)) {        // NaN propagates through the scale: the scalar code
    quantize_block(v, q, scale_out);            // keeps the first NaN's bits
    return;
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax8), _mm256_extractf128_ps(amax8, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
  const __m256 inv = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
  const __m256i low_byte = _mm256_set1_epi32(0xFF);
  __m256i b[4];
  for (int i = 0; i < 4; ++i) b[i] = _mm256_and_si256(_mm256_cvtps_epi32(_mm256_mul_ps(x[i], inv)), low_byte);
  const __m256i bytes = _mm256_packus_epi16(_mm256_packus_epi32(b[0], b[1]), _mm256_packus_epi32(b[2], b[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  *scale_out = amax / 127.f;
}
#endif

// with_fix: also the corrections (only the VNNI kernels' unsigned x signed dot reads them).
inline void quantize_rows(const float* x, int64_t M, int64_t K, QuantRows& out, bool with_fix) {
  const int64_t chunks = (K + kChunk - 1) / kChunk, blocks = K / kQBlock;
  out.chunks = chunks;
  out.pairs = (chunks + 1) / 2;
  out.q.resize(M * chunks * kChunk);            // every byte is written below: no clearing
  out.block_scale.resize(M * 4 * out.pairs);
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {    // a prompt chunk's rows, across threads
    for (int64_t m = m0; m < m1; ++m) {
      float* s = out.block_scale.data() + m * 4 * out.pairs;
      for (int64_t b = 0; b < blocks; ++b) {
        int8_t* q = out.q.data() + m * chunks * kChunk + b * kQBlock;
#if defined(INTERLOCK_VNNI)
        quantize_block_avx512(x + m * K + b * kQBlock, q, s + b);
#elif defined(INTERLOCK_AVX2)
        quantize_block_avx2(x + m * K + b * kQBlock, q, s + b);
#else
        quantize_block(x + m * K + b * kQBlock, q, s + b);
#endif
      }
      std::fill(s + blocks, s + 4 * out.pairs, 0.f);
      if (blocks % 2 == 1)                        // K % 64 == 32: the last chunk's second half is zero
        std::fill_n(out.q.data() + (m * chunks + chunks - 1) * kChunk + kQBlock, kQBlock, int8_t{0});
    }
  });
  if (!with_fix) return;
#if defined(INTERLOCK_VNNI)
  out.block_fix.resize(M * 4 * out.pairs);
  for (int64_t m = 0; m < M; ++m) {
    int32_t* fix = out.block_fix.data() + m * 4 * out.pairs;
    for (int64_t c = 0; c < chunks; ++c) {
      const __m512i sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(static_cast<char>(0x80)),
                                               _mm512_loadu_si512(out.qs(m, c)));   // 128 * 4-value sums
      fix[2 * c] = -_mm512_mask_reduce_add_epi32(0x00FF, sums);
      fix[2 * c + 1] = -_mm512_mask_reduce_add_epi32(0xFF00, sums);
    }
    std::fill(fix + 2 * chunks, fix + 4 * out.pairs, 0);
  }
  if (M > kFewRows) return;
  // Lane l of pair p takes block 4p + 2 (l % 2) + (l / 4) % 2 (int8_linear.h, pair_lane).
  const __m512i from = _mm512_setr_epi32(0, 2, 0, 2, 1, 3, 1, 3, 0, 2, 0, 2, 1, 3, 1, 3);
  out.pair_scale.resize(M * out.pairs * 16);
  out.pair_fix.resize(M * out.pairs * 16);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t p = 0; p < out.pairs; ++p) {
      _mm512_storeu_ps(out.pair_scale.data() + (m * out.pairs + p) * 16,
                       _mm512_permutexvar_ps(from, _mm512_broadcast_f32x4(_mm_loadu_ps(out.scales(m) + 4 * p))));
      const __m128i fix = _mm_loadu_si128(reinterpret_cast<const __m128i*>(out.block_fixes(m) + 4 * p));
      _mm512_storeu_si512(out.pair_fix.data() + (m * out.pairs + p) * 16,
                          _mm512_permutexvar_epi32(from, _mm512_broadcast_i32x4(fix)));
    }
#endif
}

}  // namespace interlock_cpu
