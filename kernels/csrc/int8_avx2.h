#pragma once
// int8_linear.h's (row, output) arithmetic on AVX2 + FMA, for x86 CPUs without AVX512-VNNI
// (Zen 1-3, Haswell to Alder Lake client parts). Bit-identical to the portable kernel: the same
// exact integer dot per block of 32, the same FMA per block into lane b % 4 in block order, the
// same final tree, only faster (docs/performance.md: SmolLM2's decode step 6x on a 2-core Zen 3).
//
// The dot: AVX2 has no int8 x int8 -> int32 instruction. maddubs multiplies unsigned x signed bytes
// and adds pairs into int16 with saturation; madd with ones then adds int16 pairs into int32. The
// weights' signs are moved onto the activations (|w| x sign(w) * x): |w| <= 128 read unsigned (abs
// of -128 is the byte 0x80, 128 unsigned), and the activations are within +-127 (quantize_block),
// so a pair sums to at most 32,512 in magnitude and never saturates. A block of 32 is one ymm: its
// 8 int32 lanes are added as integers (exact), four blocks at a time into one xmm of block sums,
// converted and fma'd into the row's 4 lanes at once.
#include <cstdint>

#include "int8_quant.h"

#if defined(INTERLOCK_AVX2)

namespace interlock_cpu {

// A 16-lane halving tree over lanes lo (0-7) and hi (8-15): int4_linear.h's final sums.
inline float halving_sum_avx2(__m256 lo, __m256 hi) {
  const __m256 s8 = _mm256_add_ps(lo, hi);                                          // l + (l + 8)
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));   // l + (l + 4)
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));                          // l + (l + 2)
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));                        // 0 + 1
}

// One block's 8 int32 lanes of four products: dot(|w|, sign(w) * x), aw = |w| (hoisted per block).
inline __m256i block_dot_avx2(__m256i aw, const int8_t* w, const int8_t* x) {
  const __m256i xs = _mm256_sign_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)),
                                      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
  return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xs), _mm256_set1_epi16(1));
}

// [sum of d0's lanes, d1's, d2's, d3's].
inline __m128i four_sums_avx2(__m256i d0, __m256i d1, __m256i d2, __m256i d3) {
  const __m256i t0 = _mm256_add_epi32(_mm256_unpacklo_epi32(d0, d1), _mm256_unpackhi_epi32(d0, d1));
  const __m256i t1 = _mm256_add_epi32(_mm256_unpacklo_epi32(d2, d3), _mm256_unpackhi_epi32(d2, d3));
  const __m256i u = _mm256_add_epi32(_mm256_unpacklo_epi64(t0, t1), _mm256_unpackhi_epi64(t0, t1));
  return _mm_add_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
}

// Blocks 4p .. 4p + 3 of weight row w (those below `blocks`; the others a zero dot against a zero
// scale) into each row's lanes.
template <int MB, bool Tail>
inline void quad_avx2(const int8_t* w, const int8_t* const (&xq)[MB], const float* const (&xs)[MB], int64_t p,
                      int64_t blocks, __m128 (&acc)[MB]) {
  __m256i aw[4];
  for (int i = 0; i < 4; ++i)
    aw[i] = !Tail || 4 * p + i < blocks
                ? _mm256_abs_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + (4 * p + i) * kQBlock)))
                : _mm256_setzero_si256();
#pragma GCC unroll 4
  for (int m = 0; m < MB; ++m) {
    __m256i d[4];
    for (int i = 0; i < 4; ++i) {
      const int64_t k = (4 * p + i) * kQBlock;
      d[i] = !Tail || 4 * p + i < blocks ? block_dot_avx2(aw[i], w + k, xq[m] + k) : _mm256_setzero_si256();
    }
    acc[m] = _mm_fmadd_ps(_mm_cvtepi32_ps(four_sums_avx2(d[0], d[1], d[2], d[3])), _mm_loadu_ps(xs[m] + 4 * p),
                          acc[m]);
  }
}

// out[m] = the tree sum (before the output scale) of weight row w and activation row m0 + m: the
// weight row streams past once.
template <int MB>
inline void tree_sums_avx2(const QuantRows& a, const int8_t* w, int64_t K, int64_t m0, float* out) {
  __m128 acc[MB];
  const int8_t* xq[MB];      // each row's values and block scales, hoisted: no re-indexing in the loop
  const float* xs[MB];
  // The m loops are unrolled by pragma: without it GCC kept the accumulators in registers but also
  // stored them all to the stack every chunk (a 2-, 3- or 7-row GEMV over 63 MB: 1.1-1.3x slower).
#pragma GCC unroll 4
  for (int m = 0; m < MB; ++m) {
    acc[m] = _mm_setzero_ps();
    xq[m] = a.qs(m0 + m, 0);
    xs[m] = a.scales(m0 + m);
  }
  const int64_t blocks = K / kQBlock;
  int64_t p = 0;
  for (; 4 * p + 4 <= blocks; ++p) quad_avx2<MB, false>(w, xq, xs, p, blocks, acc);
  if (4 * p < blocks) quad_avx2<MB, true>(w, xq, xs, p, blocks, acc);
#pragma GCC unroll 4
  for (int m = 0; m < MB; ++m) {
    const __m128 s2 = _mm_add_ps(acc[m], _mm_movehdup_ps(acc[m]));                   // l0 + l1, l2 + l3
    out[m] = _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehl_ps(s2, s2)));
  }
}

// Output n for rows m0 .. m0 + MB.
template <int MB>
inline void row_avx2(const QuantRows& a, const int8_t* q, const float* scale, float* y, int64_t K, int64_t N,
                     int64_t n, int64_t m0) {
  float out[MB];
  tree_sums_avx2<MB>(a, q + n * K, K, m0, out);
#pragma GCC unroll 4
  for (int m = 0; m < MB; ++m) y[(m0 + m) * N + n] = out[m] * scale[n];
}

// All M rows against outputs n0 .. n0 + nb, one output row at a time. Measured on a Zen 3 core (a
// 28 MB head, one row): one weight row streaming at a time read at the rate of a plain sequential
// read; four rows' chunks interleaved (the VNNI kernel's order) at 55-60% of it, with or without
// software prefetch. Decode and verify rows (M < 16): per output, four rows at a time, the weight
// row from memory for the first four and from L1 after.
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
