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
// activation rows, so 4 rows cost a tile pass what 1 row does (int8_amx.h); VNNI gets the block dots
// as integers too (below, and int8_vnni.h) and then converts and fmas 16 of them per instruction;
// and an integer sum first rounds once per block where per-lane fmas rounded 8 times. A zero block
// past K (padding to whole chunks) adds fma(0, 0, acc) = acc: a lane is never -0 (it starts at +0
// and only adds), so padded or not, the bits are the same.
//
// Signs: VNNI's dot takes unsigned x signed bytes. The weights are flipped to unsigned on the fly
// (w ^ 0x80 = w + 128) and the surplus 128 * sum(activations) is taken off each block's integer dot
// with -128 * (the sum of its 32 activation values), kept per row (quantize_rows).
//
// Batch invariance: a row's quantization depends on that row alone and the arithmetic above on
// nothing else, so the result is the same whatever M is and however rows and outputs are grouped
// or split across threads or kernels: a row alone equals the same row in a batch.
#include <ATen/Parallel.h>

#include <algorithm>

#include "int8_amx.h"
#include "int8_avx2.h"
#include "int8_quant.h"
#include "int8_vnni.h"

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

// One to three activation rows (a decode step, a short verify step; more take int8_vnni.h). A pair
// p of chunks (2p + g, g = 0, 1) of 4 weight rows j: v[2j + g] is the chunk's dpbusd, 16 lanes of
// four products, half h of it block 4p + 2g + h. The 8 lanes of each (j, g, h) are added as
// integers (exact in any order) into lane pair_lane(j, g, h), which accumulates row j's fp32 lane
// 2g + h (= b % 4).
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

// pair_sums when the pair has one chunk (the last of an odd number, K = 576): v[j] row j's dot,
// the g = 1 lanes zero, in about half the shuffles.
inline __m512i single_sums(const __m512i (&v)[4]) {
  const __m512i t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[0], v[1]), _mm512_unpackhi_epi32(v[0], v[1]));
  const __m512i t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2], v[3]), _mm512_unpackhi_epi32(v[2], v[3]));
  const __m512i u = _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));  // lane q: rows' q sums
  const __m512i f = _mm512_add_epi32(u, _mm512_shuffle_i32x4(u, u, _MM_SHUFFLE(2, 3, 0, 1)));       // [8h + j]: half h
  const __m512i from = _mm512_setr_epi32(0, 0, 1, 0, 8, 0, 9, 0, 2, 0, 3, 0, 10, 0, 11, 0);       // to pair_lane(j, 0, h)
  return _mm512_maskz_permutexvar_epi32(0x5555, from, f);
}

// Pair p of weight rows w[0 .. 4) for activation rows m0 .. m0 + MB into acc[MB]. The dots start
// at zero and the pair's corrections (-128 * the block sums) are added to the summed lanes: one
// add, not one per dot. Tail: the pair reaches past the whole chunks (a last half chunk, K % 64 ==
// 32, reads 32 bytes and its other lanes meet zero activations; a chunk past the last one is a zero
// dot). Near: prefetch into L1 4 KB ahead (the AMX machine's), else into L2 8 KB ahead
// (int8_quant.h: each measured where it runs).
template <int MB, bool Near, bool Tail>
inline void pair_step(const QuantRows& a, const int8_t* const (&w)[4], int64_t m0, int64_t p, int64_t full,
                      __m512 (&acc)[MB]) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i wv[4][2];
  for (int g = 0; g < 2; ++g) {
    const int64_t c = 2 * p + g;
    for (int j = 0; j < 4; ++j) {
      const int8_t* at = w[j] + c * kChunk;
      if (!Tail || c < full) {
        if (Near) _mm_prefetch(reinterpret_cast<const char*>(at + kPrefetch), _MM_HINT_T0);
        else _mm_prefetch(reinterpret_cast<const char*>(at + kPrefetchL2), _MM_HINT_T1);
        wv[j][g] = _mm512_xor_si512(flip, _mm512_loadu_si512(at));
      } else {
        wv[j][g] = c < a.chunks ? _mm512_xor_si512(flip, _mm512_maskz_loadu_epi8(0xFFFFFFFFull, at)) : flip;
      }
    }
  }
  for (int m = 0; m < MB; ++m) {
    __m512i sums;
    if (Tail && 2 * p + 1 >= a.chunks) {
      const __m512i xq = _mm512_loadu_si512(a.qs(m0 + m, 2 * p));
      __m512i v[4];
      for (int j = 0; j < 4; ++j) v[j] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[j][0], xq);
      sums = single_sums(v);
    } else {
      __m512i v[8];
      for (int g = 0; g < 2; ++g) {
        const __m512i xq = _mm512_loadu_si512(a.qs(m0 + m, 2 * p + g));
        for (int j = 0; j < 4; ++j) v[2 * j + g] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[j][g], xq);
      }
      sums = pair_sums(v);
    }
    const __m512i fix = _mm512_loadu_si512(a.pair_fixes(m0 + m, p));
    acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(sums, fix)), _mm512_loadu_ps(a.pair_scales(m0 + m, p)),
                             acc[m]);
  }
}

// The tree sums (before their output scales) of weight rows w[0 .. 4) and activation rows m0 ..
// m0 + MB, in lanes 0, 2, 8 and 10 of out[m]: ((l(j, 0, 0) + l(j, 0, 1)) + (l(j, 1, 0) + l(j, 1, 1)))
// for row j.
template <int MB, bool Near>
inline void tree_sums_vnni(const QuantRows& a, const int8_t* const (&w)[4], int64_t K, int64_t m0, __m512 (&out)[MB]) {
  for (int m = 0; m < MB; ++m) out[m] = _mm512_setzero_ps();
  const int64_t full = K / kChunk;
  int64_t p = 0;
  for (; 2 * p + 2 <= full; ++p) pair_step<MB, Near, false>(a, w, m0, p, full, out);
  if (p < a.pairs) pair_step<MB, Near, true>(a, w, m0, p, full, out);
  for (int m = 0; m < MB; ++m) {
    const __m512 h = _mm512_add_ps(out[m], _mm512_shuffle_f32x4(out[m], out[m], _MM_SHUFFLE(2, 3, 0, 1)));  // + l + 4
    out[m] = _mm512_add_ps(h, _mm512_movehdup_ps(h));                                                    // + l + 1
  }
}

#endif

#if defined(INTERLOCK_VNNI)

// y for the MB activation rows of `a` (a decode step, a verify step of 2 or 3 rows): output rows in
// fours across the threads, 64 per task at least.
template <int MB, bool Near>
inline void few_rows_vnni(const QuantRows& a, const int8_t* q, const float* scale, float* y, int64_t K, int64_t N) {
  at::parallel_for(0, (N + 3) / 4, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = 4 * b;
      const int8_t* w[4];
      for (int64_t j = 0; j < 4; ++j) w[j] = q + std::min(n0 + j, N - 1) * K;    // past N: discarded
      __m512 sums[MB];
      tree_sums_vnni<MB, Near>(a, w, K, 0, sums);
      const __mmask8 valid = static_cast<__mmask8>((1u << std::min<int64_t>(4, N - n0)) - 1);
      const __m128 s = _mm_maskz_loadu_ps(valid, scale + n0);
      for (int m = 0; m < MB; ++m)
        _mm_mask_storeu_ps(y + m * N + n0, valid,
                           _mm_mul_ps(_mm512_castps512_ps128(_mm512_maskz_compress_ps(0x0505, sums[m])), s));
    }
  });
}

#else

// Without VNNI: output rows in blocks of NB across the threads, 64 per task at least. AVX2 takes a
// block with rows_avx2 (int8_avx2.h: its own row / output order), the portable kernel output by
// output. Either order moves no bits.
template <int NB>
inline void out_blocks(const QuantRows& a, const int8_t* q, const float* scale, float* y,
                       int64_t M, int64_t K, int64_t N) {
  at::parallel_for(0, (N + NB - 1) / NB, 64 / NB, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * NB, nb = std::min<int64_t>(NB, N - n0);
#if defined(INTERLOCK_AVX2)
      rows_avx2(a, q, scale, y, M, K, N, n0, nb);
#else
      for (int64_t n = n0; n < n0 + nb; ++n)
        for (int64_t m = 0; m < M; ++m) y[m * N + n] = tree_sum_portable(a, m, q + n * K, K) * scale[n];
#endif
    }
  });
}

#endif

// out[i] = the tree sum (before its output scale) of weight row w[i] and the one activation row of
// `a`, for i < count: head_argmax.h's allowed logits, the same bits as int8_linear_raw's.
inline void tree_sums(const QuantRows& a, const int8_t* const* w, int64_t count, int64_t K, float* out) {
#if defined(INTERLOCK_VNNI)
  for (int64_t i = 0; i < count; i += 4) {
    const int8_t* four[4];
    for (int64_t j = 0; j < 4; ++j) four[j] = w[std::min(i + j, count - 1)];    // past count: discarded
    __m512 lanes[1];
    tree_sums_vnni<1, false>(a, four, K, 0, lanes);
    alignas(16) float sums[4];
    _mm_store_ps(sums, _mm512_castps512_ps128(_mm512_maskz_compress_ps(0x0505, lanes[0])));
    for (int64_t j = 0; j < 4 && i + j < count; ++j) out[i + j] = sums[j];
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
  if (M == 0) return;                  // no rows (a head with no row to score): the kernels read rows 0 .. MB
  thread_local QuantRows scratch;      // reused: a step calls this ~150 times on small rows
  const QuantRows& a = scratch;        // the caller's buffer, named so the workers read this one
#if defined(INTERLOCK_VNNI)
  const bool amx = amx_enabled();
  quantize_rows(x, M, K, scratch, /*with_fix=*/!amx || M == 1);   // the tiles' dots are signed x signed
  if (M == 1 && amx) {
    // A decode step: one row on the vector units (a tile pass costs the same for 1 row as for 4),
    // its weights prefetched into L1, as measured there.
    few_rows_vnni<1, true>(a, q, scale, y, K, N);
  } else if (amx) {
    int8_linear_amx(a, q, scale, y, M, K, N);             // int8_amx.h
  } else if (M <= kFewRows) {
    // Decode and short verify steps: the lane sums share each weight load among the rows, and
    // read 4 weight rows at a time, as streaming from memory wants (int8_vnni.h's transposed tiles
    // cost 0.7x at 2 rows, K = 2048; 1.2x from 4 rows).
    if (M == 1) few_rows_vnni<1, false>(a, q, scale, y, K, N);
    else if (M == 2) few_rows_vnni<2, false>(a, q, scale, y, K, N);
    else few_rows_vnni<3, false>(a, q, scale, y, K, N);
  } else {
    int8_linear_vnni_rows(a, q, scale, y, M, K, N);       // int8_vnni.h
  }
#else
  quantize_rows(x, M, K, scratch, /*with_fix=*/false);     // signed x signed: no corrections
  // Prompt chunks take 8 output rows per block (AVX2: per four rows, every output of the block, so
  // both stay in L1); decode and verify rows 4.
  if (M >= 16) {
    out_blocks<2 * kOutBlock>(a, q, scale, y, M, K, N);
  } else {
    out_blocks<kOutBlock>(a, q, scale, y, M, K, N);
  }
#endif
}

}  // namespace interlock_cpu
