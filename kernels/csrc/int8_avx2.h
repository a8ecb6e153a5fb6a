#pragma once
// int8_linear.h's (row, output) arithmetic on AVX2 + FMA, for x86 CPUs without AVX512-VNNI
// (Zen 1-3, Haswell to Alder Lake client parts). Bit-identical to the portable kernel: the same
// exact integer dot per lane of four weights, the same FMA per lane and chunk in K order, the same
// halving tree; only faster (SmolLM2's decode step on a 2-core Zen 3: 86 -> see docs/performance.md).
//
// The dot: AVX2 has no int8 x int8 -> int32 instruction. maddubs multiplies unsigned x signed bytes
// and adds pairs into int16 with saturation; madd with ones then adds int16 pairs into int32. The
// weights' signs are moved onto the activations (|w| x sign(w) * x): |w| <= 128 read unsigned (abs
// of -128 is the byte 0x80, 128 unsigned), and the activations are within +-127 (quantize_block),
// so a pair sums to at most 32,512 in magnitude and never saturates. Each lane's int32 is the
// exact dot of its four weights, as VNNI's dpbusd gives.
//
// Lanes 0-7 of a 64-weight chunk take the scale of its first block of 32, lanes 8-15 the second's,
// and no lane ever meets another before the final tree. So a block of outputs runs the whole K loop
// on the first halves of its chunks (8 lanes, one ymm accumulator per (output, row)), then on the
// second halves: half the accumulators live at once, and the block's weights (NB rows of K bytes)
// are still in L1 for the second pass.
#include <cstdint>

#include "int8_quant.h"

#if defined(INTERLOCK_AVX2)
#include <immintrin.h>

namespace interlock_cpu {

// One half (h = 0: lanes 0-7, h = 1: lanes 8-15) of every chunk below `chunks`, for NB outputs x
// MB rows, into acc. NB * MB <= 8 keeps the accumulators and the rows' operands in 16 registers.
template <int NB, int MB>
inline void half_pass_avx2(const QuantRows& a, const int8_t* q, int64_t K, int64_t n0, int64_t m0, int64_t chunks,
                           int h, __m256 (&acc)[NB][MB]) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t c = 0; c < chunks; ++c) {
    __m256i x[MB];
    for (int m = 0; m < MB; ++m) x[m] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qs(m0 + m, c) + h * kQBlock));
    for (int n = 0; n < NB; ++n) {
      const int8_t* at = q + (n0 + n) * K + c * kChunk + h * kQBlock;
      if (h == 0) _mm_prefetch(reinterpret_cast<const char*>(at + kPrefetchL2), _MM_HINT_T1);
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)), aw = _mm256_abs_epi8(w);
      for (int m = 0; m < MB; ++m) {
        const __m256i pairs = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x[m], w));
        const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
        acc[n][m] = _mm256_fmadd_ps(dot, _mm256_broadcast_ss(a.scales(m0 + m, c) + h * (kLanes / 2)), acc[n][m]);
      }
    }
  }
}

// The halving tree of int8_linear.h's portable kernel over lanes lo (0-7) and hi (8-15).
inline float halving_sum_avx2(__m256 lo, __m256 hi) {
  const __m256 s8 = _mm256_add_ps(lo, hi);                                          // l + (l + 8)
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));   // l + (l + 4)
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));                          // l + (l + 2)
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));                        // 0 + 1
}

// y for outputs n0 .. n0 + NB and rows m0 .. m0 + MB: as int8_linear.h's block.
template <int NB, int MB>
inline void tile_avx2(const QuantRows& a, const int8_t* q, const float* scale, float* y, int64_t K, int64_t N,
                      int64_t n0, int64_t m0) {
  static_assert(NB * MB <= 8, "accumulators beyond the 16 ymm registers");
  __m256 lo[NB][MB], hi[NB][MB];
  for (int n = 0; n < NB; ++n)
    for (int m = 0; m < MB; ++m) lo[n][m] = hi[n][m] = _mm256_setzero_ps();
  const int64_t full = K / kChunk;
  half_pass_avx2<NB, MB>(a, q, K, n0, m0, a.chunks, 0, lo);
  half_pass_avx2<NB, MB>(a, q, K, n0, m0, full, 1, hi);
  // K % 64 == 32: the last chunk's second half has no weights; the portable kernel adds its zero
  // product there (fma(0, 0, acc)), which turns a -0 lane into +0. The same add keeps the bits.
  if (full < a.chunks)
    for (int n = 0; n < NB; ++n)
      for (int m = 0; m < MB; ++m) hi[n][m] = _mm256_add_ps(hi[n][m], _mm256_setzero_ps());
  for (int n = 0; n < NB; ++n)
    for (int m = 0; m < MB; ++m) y[(m0 + m) * N + n0 + n] = halving_sum_avx2(lo[n][m], hi[n][m]) * scale[n0 + n];
}

// NB outputs x MB rows in tiles of at most 8 accumulators: 4 outputs a tile with one row, 4 with two.
template <int NB, int MB>
inline void block_avx2(const QuantRows& a, const int8_t* q, const float* scale, float* y, int64_t K, int64_t N,
                       int64_t n0, int64_t m0) {
  constexpr int kTileN = NB < 4 ? NB : 4;
  static_assert(NB % kTileN == 0, "output blocks of 1, 2 or a multiple of 4");
  for (int n = 0; n < NB; n += kTileN) tile_avx2<kTileN, MB>(a, q, scale, y, K, N, n0 + n, m0);
}

}  // namespace interlock_cpu

#endif
