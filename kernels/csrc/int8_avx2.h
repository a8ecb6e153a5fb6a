#pragma once
// int8_linear.h's (row, output) arithmetic on AVX2 + FMA, for x86 CPUs without AVX512-VNNI
// (Zen 1-3, Haswell to Alder Lake client parts). Bit-identical to the portable kernel: the same
// exact integer dot per lane of four weights, the same FMA per lane and chunk in K order, the same
// halving tree, only faster (docs/performance.md: SmolLM2's decode step 6x on a 2-core Zen 3).
//
// The dot: AVX2 has no int8 x int8 -> int32 instruction. maddubs multiplies unsigned x signed bytes
// and adds pairs into int16 with saturation; madd with ones then adds int16 pairs into int32. The
// weights' signs are moved onto the activations (|w| x sign(w) * x): |w| <= 128 read unsigned (abs
// of -128 is the byte 0x80, 128 unsigned), and the activations are within +-127 (quantize_block),
// so a pair sums to at most 32,512 in magnitude and never saturates. Each lane's int32 is the
// exact dot of its four weights, as VNNI's dpbusd gives.
//
// Lanes 0-7 of a 64-weight chunk take the scale of its first block of 32, lanes 8-15 the second's:
// two ymm accumulators per (output, row), meeting only in the final tree.
#include <cstdint>

#include "int8_quant.h"

#if defined(INTERLOCK_AVX2)

namespace interlock_cpu {

// The halving tree of int8_linear.h's portable kernel over lanes lo (0-7) and hi (8-15).
inline float halving_sum_avx2(__m256 lo, __m256 hi) {
  const __m256 s8 = _mm256_add_ps(lo, hi);                                          // l + (l + 8)
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));   // l + (l + 4)
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));                          // l + (l + 2)
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));                        // 0 + 1
}

// Lanes 0-7 (block 2c) or 8-15 (block 2c + 1) of one chunk: acc += dot(|w|, sign(w) * x) * scale.
inline __m256 half_dot_avx2(__m256i aw, __m256i w, const int8_t* x, const float* lane_scale, __m256 acc) {
  const __m256i xs = _mm256_sign_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)), w);
  const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xs), _mm256_set1_epi16(1));
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_broadcast_ss(lane_scale), acc);
}

// Output n for rows m0 .. m0 + MB, as int8_linear.h's block: the weight row streams past once.
template <int MB>
inline void row_avx2(const QuantRows& a, const int8_t* q, const float* scale, float* y, int64_t K, int64_t N,
                     int64_t n, int64_t m0) {
  __m256 lo[MB], hi[MB];
  const int8_t* xq[MB];      // each row's chunk 0: the loop below steps them by a chunk, no re-indexing
  const float* xs[MB];
  // The m loops are unrolled by pragma: without it GCC kept lo / hi in registers but also stored
  // them all to the stack every chunk (a 2-, 3- or 7-row GEMV over 63 MB: 1.1-1.3x slower).
#pragma GCC unroll 4
  for (int m = 0; m < MB; ++m) {
    lo[m] = hi[m] = _mm256_setzero_ps();
    xq[m] = a.qs(m0 + m, 0);
    xs[m] = a.scales(m0 + m, 0);
  }
  const int8_t* w = q + n * K;
  const int64_t full = K / kChunk;
  for (int64_t c = 0; c < full; ++c) {
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + c * kChunk));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + c * kChunk + kQBlock));
    const __m256i a0 = _mm256_abs_epi8(w0), a1 = _mm256_abs_epi8(w1);
#pragma GCC unroll 4
    for (int m = 0; m < MB; ++m) {
      lo[m] = half_dot_avx2(a0, w0, xq[m] + c * kChunk, xs[m] + c * kLanes, lo[m]);
      hi[m] = half_dot_avx2(a1, w1, xq[m] + c * kChunk + kQBlock, xs[m] + c * kLanes + kLanes / 2, hi[m]);
    }
  }
  if (full < a.chunks) {
    // K % 64 == 32: the last chunk's second half has no weights; the portable kernel adds its zero
    // product there (fma(0, 0, acc)), which turns a -0 lane into +0. The same add keeps the bits.
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + full * kChunk));
    const __m256i a0 = _mm256_abs_epi8(w0);
#pragma GCC unroll 4
    for (int m = 0; m < MB; ++m) {
      lo[m] = half_dot_avx2(a0, w0, xq[m] + full * kChunk, xs[m] + full * kLanes, lo[m]);
      hi[m] = _mm256_add_ps(hi[m], _mm256_setzero_ps());
    }
  }
#pragma GCC unroll 4
  for (int m = 0; m < MB; ++m) y[(m0 + m) * N + n] = halving_sum_avx2(lo[m], hi[m]) * scale[n];
}

// NB outputs x MB rows, one output row at a time. Measured on a Zen 3 core (a 28 MB head, one
// row): one weight row streaming at a time read at the rate of a plain sequential read; four rows'
// chunks interleaved (the VNNI kernel's order) at 55-60% of it, with or without software prefetch.
template <int NB, int MB>
inline void block_avx2(const QuantRows& a, const int8_t* q, const float* scale, float* y, int64_t K, int64_t N,
                       int64_t n0, int64_t m0) {
  for (int n = 0; n < NB; ++n) row_avx2<MB>(a, q, scale, y, K, N, n0 + n, m0);
}

// All M rows against outputs n0 .. n0 + nb. Decode and verify rows (M < 16): per output, four rows
// at a time (8 accumulators), the weight row from memory for the first four and from L1 after.
// Prompt chunks: per four rows, every output of the block, so the four rows' activations (~1 KB each
// at K = 576) and the block's weight rows both stay in L1; output by output, all M rows came from L2
// once per output. (With row_avx2's hoisted row pointers and the vector quantize_block_avx2: a
// 256-row chunk's projections 1.3-1.7x faster on a 2-core Zen 3, 65-67 -> 86-105 GOP/s.) Each
// (row, output) is the same row_avx2 either way: the order moves no bits.
inline void rows_avx2(const QuantRows& a, const int8_t* q, const float* scale, float* y, int64_t M, int64_t K,
                      int64_t N, int64_t n0, int64_t nb) {
  const auto tail = [&](int64_t n, int64_t m) {
    switch (M - m) {
      case 3: row_avx2<3>(a, q, scale, y, K, N, n, m); break;
      case 2: row_avx2<2>(a, q, scale, y, K, N, n, m); break;
      case 1: row_avx2<1>(a, q, scale, y, K, N, n, m); break;
      default: break;
    }
  };
  if (M < 16) {
    for (int64_t n = n0; n < n0 + nb; ++n) {
      int64_t m = 0;
      for (; m + 4 <= M; m += 4) row_avx2<4>(a, q, scale, y, K, N, n, m);
      tail(n, m);
    }
    return;
  }
  int64_t m = 0;
  for (; m + 4 <= M; m += 4)
    for (int64_t n = n0; n < n0 + nb; ++n) row_avx2<4>(a, q, scale, y, K, N, n, m);
  for (int64_t n = n0; n < n0 + nb; ++n) tail(n, m);
}

}  // namespace interlock_cpu

#endif
