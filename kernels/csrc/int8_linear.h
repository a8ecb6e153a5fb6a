#pragma once
// y[M, N] = (x[M, K] . q[N, K]^T) * scale[N]: fp32 activations, int8 weights, one scale per
// output row. The CPU decode and verify projections (few rows, bound by weight bytes).
//
// Why our own: torch's _weight_int8pack_mm rounds activations to bf16 and its cost grows with
// the row count (4 rows ~1.3-1.9x one row here), which makes a speculative verify step expensive.
// This kernel converts each 16-weight chunk to fp32 once per group of up to four activation rows
// and feeds it to FMAs, so extra rows cost FMAs rather than weight bytes; activations stay fp32.
//
// Batch invariance: the result for one (row m, output n) is a fixed sequence of fp32 operations
// -- two accumulators over alternating 16-wide chunks of K, added, reduced in a fixed tree, scaled
// -- whatever M is and however rows and outputs are grouped or split across threads. Grouping
// only interleaves independent chains. So a row computed alone equals the same row in a batch.
#include <ATen/Parallel.h>

#include <cstdint>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace interlock_cpu {

constexpr int64_t kChunk = 16;       // weights per vector
constexpr int64_t kOutBlock = 4;     // output rows per task unit
// Weights stream from L3 or memory (the model is larger than L2): prefetch this far ahead of each
// row's read. Measured for all of SmolLM2's weights at 2 threads: 512 B 9.6 ms, 1 KB 8.5 ms,
// 2 KB 6.7 ms, 4 KB 4.3 ms, 8 KB 4.6 ms, 16 KB 6.0 ms (one sweep, with a build running beside it).
constexpr int64_t kPrefetch = 4096;

#if defined(__AVX512F__)

template <int NB, int MB, int P>
inline void step(const float* x, const int8_t* q, int64_t K, int64_t n0, int64_t m0, int64_t c,
                 __m512 (&acc)[NB][MB][2]) {
  __m512 xv[MB];
  for (int m = 0; m < MB; ++m) xv[m] = _mm512_loadu_ps(x + (m0 + m) * K + c * kChunk);
  for (int n = 0; n < NB; ++n) {
    const int8_t* at = q + (n0 + n) * K + c * kChunk;
    if (P == 0) _mm_prefetch(reinterpret_cast<const char*>(at + kPrefetch), _MM_HINT_T0);
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(at));
    const __m512 w = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(raw));
    for (int m = 0; m < MB; ++m) acc[n][m][P] = _mm512_fmadd_ps(w, xv[m], acc[n][m][P]);
  }
}

// NB output rows x MB activation rows, two partial sums each: 2*NB*MB independent FMA chains.
template <int NB, int MB>
inline void block(const float* x, const int8_t* q, const float* scale, float* y,
                  int64_t K, int64_t N, int64_t n0, int64_t m0) {
  __m512 acc[NB][MB][2];
  for (int n = 0; n < NB; ++n)
    for (int m = 0; m < MB; ++m) acc[n][m][0] = acc[n][m][1] = _mm512_setzero_ps();
  // Chunk c goes to accumulator c % 2; the pair is unrolled so the accumulators stay in registers.
  const int64_t chunks = K / kChunk;
  int64_t c = 0;
  for (; c + 2 <= chunks; c += 2) {
    step<NB, MB, 0>(x, q, K, n0, m0, c, acc);
    step<NB, MB, 1>(x, q, K, n0, m0, c + 1, acc);
  }
  if (c < chunks) step<NB, MB, 0>(x, q, K, n0, m0, c, acc);
  for (int n = 0; n < NB; ++n)
    for (int m = 0; m < MB; ++m)
      y[(m0 + m) * N + n0 + n] =
          _mm512_reduce_add_ps(_mm512_add_ps(acc[n][m][0], acc[n][m][1])) * scale[n0 + n];
}

#else

// Portable fallback with the same per-(m, n) order: lane-wise sums, pairwise tree at the end.
template <int NB, int MB>
inline void block(const float* x, const int8_t* q, const float* scale, float* y,
                  int64_t K, int64_t N, int64_t n0, int64_t m0) {
  for (int n = 0; n < NB; ++n)
    for (int m = 0; m < MB; ++m) {
      float acc[2][kChunk] = {};
      for (int64_t c = 0; c < K / kChunk; ++c)
        for (int64_t l = 0; l < kChunk; ++l)
          acc[c & 1][l] += float(q[(n0 + n) * K + c * kChunk + l]) * x[(m0 + m) * K + c * kChunk + l];
      float lanes[kChunk];
      for (int64_t l = 0; l < kChunk; ++l) lanes[l] = acc[0][l] + acc[1][l];
      for (int64_t w = kChunk / 2; w > 0; w /= 2)
        for (int64_t l = 0; l < w; ++l) lanes[l] += lanes[l + w];
      y[(m0 + m) * N + n0 + n] = lanes[0] * scale[n0 + n];
    }
}

#endif

// All M rows against output rows n0 .. n0 + NB. Four activation rows share each converted weight
// chunk (16 accumulators for two output rows); the remainder goes two or one at a time.
template <int NB>
inline void rows(const float* x, const int8_t* q, const float* scale, float* y,
                 int64_t M, int64_t K, int64_t N, int64_t n0) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4)
    for (int64_t n = n0; n < n0 + NB; n += 2) {
      if (n + 2 <= n0 + NB) block<2, 4>(x, q, scale, y, K, N, n, m);
      else block<1, 4>(x, q, scale, y, K, N, n, m);
    }
  if (m + 2 <= M) { block<NB, 2>(x, q, scale, y, K, N, n0, m); m += 2; }
  if (m < M) block<NB, 1>(x, q, scale, y, K, N, n0, m);
}

// y[M, N] = (x[M, K] . q[N, K]^T) * scale[N], parallel over blocks of output rows.
inline void int8_linear_raw(const float* x, const int8_t* q, const float* scale, float* y,
                            int64_t M, int64_t K, int64_t N) {
  const int64_t blocks = (N + kOutBlock - 1) / kOutBlock;
  // 16 blocks (64 output rows) per task at least: enough work to hide the fork, small enough to balance.
  at::parallel_for(0, blocks, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * kOutBlock;
      if (n0 + kOutBlock <= N) {
        rows<kOutBlock>(x, q, scale, y, M, K, N, n0);
      } else {
        for (int64_t n = n0; n < N; ++n) rows<1>(x, q, scale, y, M, K, N, n);
      }
    }
  });
}

}  // namespace interlock_cpu
