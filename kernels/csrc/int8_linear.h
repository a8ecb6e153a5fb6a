#pragma once
// y[M, N] = (x[M, K] . q[N, K]^T) * scale[N]: int8 weights with one scale per output row, and
// activations quantized on the fly to int8 in blocks of 32 along K with one fp32 scale per block
// (the Q8_0 activations of llama.cpp). The CPU decode and verify projections, and prompt chunks.
//
// Why int8 activations: with fp32 activations every weight is converted to fp32 and fed to one
// FMA per activation row, which made 4 rows compute-bound (the GEMV over all weights took
// 1.2-1.45x the 1-row time). AVX512-VNNI multiplies 64 int8 pairs per instruction and AMX tiles
// 16 x 16 x 64 (int8_amx.h), so extra rows stay under the weight-streaming time. Quality against the
// bf16 model, measured by benchmarks/kernel_quality.py, is in README ("Native CPU kernels").
//
// The arithmetic, per (activation row m, output n), that every kernel computes (AMX tiles, VNNI,
// AVX2, portable; each path's bits are the portable kernel's, which is written as this list):
//   d_b = the exact int32 dot of block b's 32 weights and 32 activation values (|d_b| < 2^24, so
//         float(d_b) is exact);
//   lane L = b % 4: acc_L = fma(float(d_b), s_b, acc_L) in block order, from +0 (s_b: block b's
//         activation scale);
//   y = ((acc_0 + acc_1) + (acc_2 + acc_3)) * scale[n].
// Why this one: a tile column holds a block's exact dot and 4 lanes fill a tile's 16 columns with 4
// activation rows, so 4 rows cost a tile pass what 1 row does; VNNI sums a block's 8 lanes as
// integers (shuffles, exact) and then converts and fmas 16 (row, block) sums per instruction; and
// integer sums first round once per block where per-lane fmas rounded 8 times. A zero block past K
// (padding to whole chunks) adds fma(0, 0, acc) = acc: a lane is never -0 (it starts at +0 and
// only adds), so padded or not, the bits are the same.
//
// Signs: VNNI's dot takes unsigned x signed bytes. The weights are flipped to unsigned on the fly
// (w ^ 0x80 = w + 128) and the surplus 128 * sum(activations) is subtracted by starting each
// chunk's integer accumulator at -128 * (sum of each lane's four activations), kept per row.
//
// Batch invariance: a row's quantization depends on that row alone and the arithmetic above on
// nothing else, so the result is the same whatever M is and however rows and outputs are grouped
// or split across threads or kernels: a row alone equals the same row in a batch.
#include <ATen/Parallel.h>

#include <algorithm>

#include "int8_amx.h"
#include "int8_avx2.h"
#include "int8_quant.h"

namespace interlock_cpu {

// The portable kernel (INTERLOCK_SIMD=0, or a CPU with neither AVX2 nor VNNI): the arithmetic
// above, as written there. What every SIMD kernel must equal bit for bit.
inline float tree_sum_portable(const QuantRows& a, int64_t m, const int8_t* w, int64_t K) {
  const int8_t* x = a.qs(m, 0);          // the row's chunks are contiguous
  const float* s = a.scales(m);
  float acc[4] = {};
  for (int64_t b = 0; b < K / kQBlock; ++b) {
    int32_t dot = 0;
    for (int64_t i = b * kQBlock; i < (b + 1) * kQBlock; ++i) dot += int32_t(w[i]) * x[i];
    acc[b % 4] = std::fma(float(dot), s[b], acc[b % 4]);
  }
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

#if defined(INTERLOCK_VNNI)

// A pair p of chunks (2p + g, g = 0, 1) of 4 weight rows j against one activation row: v[2j + g]
// is the chunk's dpbusd, 16 lanes of four products, half h of it block 4p + 2g + h. The 8 lanes of
// each (j, g, h) are added as integers (exact in any order) into lane pair_lane(j, g, h), which
// accumulates row j's fp32 lane 2g + h (= b % 4).
inline int pair_lane(int j, int g, int h) { return 8 * (j / 2) + 4 * h + 2 * (j % 2) + g; }

inline __m512i pair_sums(const __m512i (&v)[8]) {
  __m512i t[4], u[2];
  for (int i = 0; i < 4; ++i)
    t[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 2; ++i)
    u[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(t[2 * i], t[2 * i + 1]), _mm512_unpackhi_epi64(t[2 * i], t[2 * i + 1]));
  return _mm512_add_epi32(_mm512_shuffle_i32x4(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_i32x4(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// The scales of blocks 4p .. 4p + 3 (s[0 .. 4)) in pair_lane's layout: lane l takes block
// 4p + 2 (l % 2) + (l / 4) % 2.
inline __m512 pair_scales(const float* s) {
  const __m512i from = _mm512_setr_epi32(0, 2, 0, 2, 1, 3, 1, 3, 0, 2, 0, 2, 1, 3, 1, 3);
  return _mm512_permutexvar_ps(from, _mm512_broadcast_f32x4(_mm_loadu_ps(s)));
}

// Pair p of weight rows w[0 .. NB) against activation rows m0 .. m0 + MB, into acc[NB / 4][MB].
// The NB rows' chunks are loaded once, in registers, and each activation row's data streams past
// them. Tail: the pair reaches past the whole chunks (a last half chunk, K % 64 == 32, reads 32
// bytes and its other lanes meet zero activations; a chunk past the last one is a zero dot).
// Near: prefetch into L1 4 KB ahead (the AMX machine's one-row path), else into L2 8 KB ahead
// (int8_quant.h: each measured where it runs).
template <int NB, int MB, bool Near, bool Tail>
inline void pair_step(const QuantRows& a, const int8_t* const (&w)[NB], int64_t m0, int64_t p, int64_t full,
                      __m512 (&acc)[NB / 4][MB]) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i wv[NB][2];
  for (int n = 0; n < NB; ++n)
    for (int g = 0; g < 2; ++g) {
      const int64_t c = 2 * p + g;
      const int8_t* at = w[n] + c * kChunk;
      if (!Tail || c < full) {
        if (Near) _mm_prefetch(reinterpret_cast<const char*>(at + kPrefetch), _MM_HINT_T0);
        else _mm_prefetch(reinterpret_cast<const char*>(at + kPrefetchL2), _MM_HINT_T1);
        wv[n][g] = _mm512_xor_si512(flip, _mm512_loadu_si512(at));
      } else {
        wv[n][g] = c < a.chunks ? _mm512_xor_si512(flip, _mm512_maskz_loadu_epi8(0xFFFFFFFFull, at)) : flip;
      }
    }
  for (int m = 0; m < MB; ++m) {
    const __m512 s = pair_scales(a.scales(m0 + m) + 4 * p);
    for (int n4 = 0; n4 < NB / 4; ++n4) {
      __m512i v[8];
      for (int g = 0; g < 2; ++g) {
        const int64_t c = 2 * p + g;
        if (Tail && c >= a.chunks) {
          for (int j = 0; j < 4; ++j) v[2 * j + g] = _mm512_setzero_si512();
          continue;
        }
        const __m512i xq = _mm512_loadu_si512(a.qs(m0 + m, c)), fix = _mm512_loadu_si512(a.fix(m0 + m, c));
        for (int j = 0; j < 4; ++j) v[2 * j + g] = _mm512_dpbusd_epi32(fix, wv[4 * n4 + j][g], xq);
      }
      acc[n4][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pair_sums(v)), s, acc[n4][m]);
    }
  }
}

// out[m][n] = the tree sum (before scale[n]) of weight row w[n] (NB a multiple of 4) and activation
// row m0 + m.
template <int NB, int MB, bool Near>
inline void tree_sums_vnni(const QuantRows& a, const int8_t* const (&w)[NB], int64_t K, int64_t m0,
                           float (&out)[MB][NB]) {
  __m512 acc[NB / 4][MB];
  for (int n4 = 0; n4 < NB / 4; ++n4)
    for (int m = 0; m < MB; ++m) acc[n4][m] = _mm512_setzero_ps();
  const int64_t full = K / kChunk;
  int64_t p = 0;
  for (; 2 * p + 2 <= full; ++p) pair_step<NB, MB, Near, false>(a, w, m0, p, full, acc);
  if (p < a.pairs) pair_step<NB, MB, Near, true>(a, w, m0, p, full, acc);
  alignas(64) float l[16];
  for (int n4 = 0; n4 < NB / 4; ++n4)
    for (int m = 0; m < MB; ++m) {
      _mm512_store_ps(l, acc[n4][m]);
      for (int j = 0; j < 4; ++j)
        out[m][4 * n4 + j] = (l[pair_lane(j, 0, 0)] + l[pair_lane(j, 0, 1)]) +
                             (l[pair_lane(j, 1, 0)] + l[pair_lane(j, 1, 1)]);
    }
}

// Output rows n0 .. n0 + NB (those below N) x activation rows m0 .. m0 + MB.
template <int NB, int MB, bool Near>
inline void block_vnni(const QuantRows& a, const int8_t* q, const float* scale, float* y,
                       int64_t K, int64_t N, int64_t n0, int64_t m0) {
  const int8_t* w[NB];
  for (int n = 0; n < NB; ++n) w[n] = q + std::min<int64_t>(n0 + n, N - 1) * K;   // past N: discarded
  float out[MB][NB];
  tree_sums_vnni<NB, MB, Near>(a, w, K, m0, out);
  for (int m = 0; m < MB; ++m)
    for (int n = 0; n < NB && n0 + n < N; ++n) y[(m0 + m) * N + n0 + n] = out[m][n] * scale[n0 + n];
}

#endif

// NB output rows from n0 (those below N) x MB activation rows on this machine's kernel.
template <int NB, int MB, bool Near>
inline void block(const QuantRows& a, const int8_t* q, const float* scale, float* y,
                  int64_t K, int64_t N, int64_t n0, int64_t m0) {
#if defined(INTERLOCK_VNNI)
  block_vnni<NB, MB, Near>(a, q, scale, y, K, N, n0, m0);
#else
  for (int64_t n = n0; n < std::min<int64_t>(n0 + NB, N); ++n)
    for (int64_t m = m0; m < m0 + MB; ++m) y[m * N + n] = tree_sum_portable(a, m, q + n * K, K) * scale[n];
#endif
}

// All M rows against output rows n0 .. n0 + NB (those below N), two activation rows at a time: the
// block's weights come from memory on the first pair and from L1 after it (NB rows of K bytes).
template <int NB, bool Near>
inline void rows(const QuantRows& a, const int8_t* q, const float* scale, float* y,
                 int64_t M, int64_t K, int64_t N, int64_t n0) {
#if defined(INTERLOCK_AVX2)
  rows_avx2(a, q, scale, y, M, K, N, n0, std::min<int64_t>(NB, N - n0));   // its own row / output order
#else
  int64_t m = 0;
  for (; m + 2 <= M; m += 2) block<NB, 2, Near>(a, q, scale, y, K, N, n0, m);
  if (m < M) block<NB, 1, Near>(a, q, scale, y, K, N, n0, m);
#endif
}

// y for all M rows, output rows split across the threads in blocks of NB.
template <int NB, bool Near = false>
inline void out_blocks(const QuantRows& a, const int8_t* q, const float* scale, float* y,
                       int64_t M, int64_t K, int64_t N) {
  const int64_t blocks = (N + NB - 1) / NB;
  // 64 output rows per task at least: enough work to hide the fork, small enough to balance.
  at::parallel_for(0, blocks, 64 / NB, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) rows<NB, Near>(a, q, scale, y, M, K, N, b * NB);
  });
}

// out[i] = the tree sum (before its output scale) of weight row w[i] and activation row 0 of `a`,
// for i < count: head_argmax.h's allowed logits, the same bits as int8_linear_raw's.
inline void tree_sums(const QuantRows& a, const int8_t* const* w, int64_t count, int64_t K, float* out) {
#if defined(INTERLOCK_VNNI)
  for (int64_t i = 0; i < count; i += 4) {
    const int8_t* four[4];
    for (int64_t j = 0; j < 4; ++j) four[j] = w[std::min(i + j, count - 1)];    // past count: discarded
    float sums[1][4];
    tree_sums_vnni<4, 1, false>(a, four, K, 0, sums);
    for (int64_t j = 0; j < 4 && i + j < count; ++j) out[i + j] = sums[0][j];
  }
#elif defined(INTERLOCK_AVX2)
  for (int64_t i = 0; i < count; ++i) tree_sums_avx2<1>(a, w[i], K, 0, out + i);
#else
  for (int64_t i = 0; i < count; ++i) out[i] = tree_sum_portable(a, 0, w[i], K);
#endif
}

// y[M, N] = (x[M, K] . q[N, K]^T) * scale[N], K a multiple of 32; parallel over output rows.
inline void int8_linear_raw(const float* x, const int8_t* q, const float* scale, float* y,
                            int64_t M, int64_t K, int64_t N) {
  thread_local QuantRows scratch;      // reused: a step calls this ~150 times on small rows
  const bool amx = amx_enabled();
#if defined(INTERLOCK_VNNI)
  quantize_rows(x, M, K, scratch, /*with_fix=*/!amx || M == 1);   // the VNNI kernels read the fix
#else
  quantize_rows(x, M, K, scratch, /*with_fix=*/false);             // signed x signed: no fix
#endif
  const QuantRows& a = scratch;        // the caller's buffer, named so the workers read this one
  if (amx && M == 1) {
    // One row takes the vector units: a tile pass costs the same for 1 row as for 4, and a decode
    // step has one row. Its weights stream from memory, prefetched into L1.
    out_blocks<kOutBlock, true>(a, q, scale, y, M, K, N);
    return;
  }
  if (amx) {
    int8_linear_amx(a, q, scale, y, M, K, N);
    return;
  }
  // Prompt chunks take 8 output rows per block: each activation chunk loaded from L2 then feeds
  // 8 dots instead of 4 (measured on Zen 4: prefill +7%). Decode and verify rows keep 4: their
  // weights stream from memory, and 8 rows' streams at once made those steps ~5% slower. Each
  // (row, output) is computed the same way either way: the block size moves no bits.
  if (M >= 16) {
    out_blocks<2 * kOutBlock>(a, q, scale, y, M, K, N);
  } else {
    out_blocks<kOutBlock>(a, q, scale, y, M, K, N);
  }
}

}  // namespace interlock_cpu
