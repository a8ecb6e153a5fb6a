#pragma once
// Row-path attention for the CPU forward (fp32 activations); the elementwise parts of a layer are
// elementwise.h's.
//
// attend_rows: each new token of a sequence (a decode row or a verify row) attends over exactly
// its own context -- positions 0 .. its own, or with a sliding window W only the last W of them
// (p - W + 1 .. p) -- read in place from the paged KV cache through the
// block table, in fixed tiles of keys; a fixed sequence of fp32 operations that depends only on
// that row's data and position: bitwise the same whether the row is alone or one of K+1. It
// replaces ~12 small torch ops per row and layer (slices, transposes, matmuls, softmax, stack).
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "avx2_math.h"
#include "elementwise.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "simd.h"

namespace interlock_cpu {

// The KV cache holds fp32, fp16 or bf16 (half the bytes a long context reads per row); the
// arithmetic is fp32 either way. fp16 and bf16 -> fp32 are exact, so all three give the same kind
// of fixed per-row computation. fp16 keeps 3 more significand bits than bf16, and a K/V entry
// rarely comes near its 65,504 limit.
using bf16 = c10::BFloat16;
using f16 = c10::Half;

inline float to_f32(float v) { return v; }
inline float to_f32(bf16 v) { return static_cast<float>(v); }
inline float to_f32(f16 v) { return static_cast<float>(v); }

#if defined(INTERLOCK_AVX512)
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const bf16* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline __m512 load16(const f16* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
#endif

// Dot product of two fp32 vectors of length D (a multiple of 16), fixed order.
template <class T>
inline float dot(const float* a, const T* b, int64_t D) {
#if defined(INTERLOCK_AVX512)
  __m512 acc = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; d += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), load16(b + d), acc);
  return _mm512_reduce_add_ps(acc);
#else
  float acc = 0.f;
  for (int64_t d = 0; d < D; ++d) acc += a[d] * to_f32(b[d]);
  return acc;
#endif
}

#if defined(INTERLOCK_AVX512)
// Horizontal sums of 16 vectors: lane i = sum of v[i]'s lanes, each in a fixed tree of its own
// lanes (the shuffles only route), so a key's score does not depend on its neighbours.
inline __m512 sum16(__m512 (&v)[16]) {
  __m512 t[8], u[4], w[2];
  for (int i = 0; i < 8; ++i)       // per 128-bit quarter: [a0+a2, b0+b2, a1+a3, b1+b3]
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)       // per quarter: the quarter sums of four vectors
    u[i] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0x44), _mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0xEE));
  for (int i = 0; i < 2; ++i)       // quarters: half sums
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
}
#endif

// out[i] = dot(q, keys[i]) * scale for i < 16 (D a multiple of 16), on AVX-512 and portable builds
// (AVX2 ones score through scores_t). All 16 pointers must be valid (the caller pads with a zero
// vector), so the loop has a fixed count and the 16 accumulators stay in registers.
template <class T>
inline void scores16(const float* q, const T* const* keys, int64_t D, float scale, float* out) {
#if defined(INTERLOCK_AVX512)
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; d += 16) {
    const __m512 qv = _mm512_loadu_ps(q + d);
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ps(qv, load16(keys[i] + d), acc[i]);
  }
  _mm512_storeu_ps(out, _mm512_mul_ps(sum16(acc), _mm512_set1_ps(scale)));
#else
  for (int i = 0; i < 16; ++i) out[i] = dot(q, keys[i], D) * scale;
#endif
}

#if defined(INTERLOCK_AVX512)
// In place: r[d] lane i <- r[i] lane d (a 16 x 16 fp32 transpose).
inline void transpose16(__m512 (&r)[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {           // pairs of rows interleaved by element
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {           // then by pairs of elements
    for (int j = 0; j < 2; ++j) {
      r[i + j] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + j]), _mm512_castps_pd(t[i + j + 2])));
      r[i + j + 2] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + j]), _mm512_castps_pd(t[i + j + 2])));
    }
  }
  // Now r[4a + b] holds, in its 128-bit quarter Q, element 4Q + (b's slot) of rows 4a .. 4a + 3:
  // r[4a+0]: col 4Q+0, r[4a+2]: 4Q+1, r[4a+1]: 4Q+2, r[4a+3]: 4Q+3. Gather the quarters of the
  // four row groups: column c = 4Q + k comes from quarter Q of r[4a + slot(k)] for a = 0..3.
  const int slot[4] = {0, 2, 1, 3};
  for (int k = 0; k < 4; ++k) {
    const __m512 a0 = r[slot[k]], a1 = r[4 + slot[k]], a2 = r[8 + slot[k]], a3 = r[12 + slot[k]];
    const __m512 lo01 = _mm512_shuffle_f32x4(a0, a1, _MM_SHUFFLE(2, 0, 2, 0)), hi01 = _mm512_shuffle_f32x4(a0, a1, _MM_SHUFFLE(3, 1, 3, 1));
    const __m512 lo23 = _mm512_shuffle_f32x4(a2, a3, _MM_SHUFFLE(2, 0, 2, 0)), hi23 = _mm512_shuffle_f32x4(a2, a3, _MM_SHUFFLE(3, 1, 3, 1));
    t[k] = _mm512_shuffle_f32x4(lo01, lo23, _MM_SHUFFLE(2, 0, 2, 0));         // quarter 0 of each
    t[4 + k] = _mm512_shuffle_f32x4(hi01, hi23, _MM_SHUFFLE(2, 0, 2, 0));     // quarter 1
    t[8 + k] = _mm512_shuffle_f32x4(lo01, lo23, _MM_SHUFFLE(3, 1, 3, 1));     // quarter 2
    t[12 + k] = _mm512_shuffle_f32x4(hi01, hi23, _MM_SHUFFLE(3, 1, 3, 1));    // quarter 3
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

// The keys of a tile, 16 at a time, as fp32 with the keys in lanes: kt[(c * D + d) * 16 + i] is
// dimension d of key 16c + i (n a multiple of 16; the caller pads with a zero vector).
template <class T>
inline void transpose_keys(const T* const* keys, int64_t n, int64_t D, float* kt) {
  for (int64_t c = 0; c < n / 16; ++c)
    for (int64_t d0 = 0; d0 < D; d0 += 16) {
      __m512 r[16];
      for (int i = 0; i < 16; ++i) r[i] = load16(keys[16 * c + i] + d0);
      transpose16(r);
      for (int d = 0; d < 16; ++d) _mm512_storeu_ps(kt + (c * D + d0 + d) * 16, r[d]);
    }
}

// scores16 for 4 queries at once, from 16 transposed keys (kt: 16 * NV dims x 16). Per key it is the same
// sequence of fp32 operations as scores16 -- lane j of the dot accumulates q[j + 16t] * k[j + 16t]
// by FMA from zero, t in order, and the 16 lane sums meet in sum16's tree, ((l0 + l2) + (l1 + l3))
// per quarter, then (Q0 + Q1) + (Q2 + Q3) -- only with the keys in lanes, so the tree is vertical
// adds instead of shuffles and each key vector is read once for the four queries. Bitwise equal to
// scores16, so a row's scores do not depend on which of the two computed them. NV = D / 16 is a
// template argument so the 16 partial sums stay in registers.
template <int NV>
inline void scores16_x4(const float* const (&q)[4], const float* kt, float scale, float* const (&out)[4]) {
  __m512 s01[4], s2[4];
  for (int quad = 0; quad < 4; ++quad) {
    __m512 p[4][4];
    for (int jj = 0; jj < 4; ++jj) {
      const int j = 4 * quad + jj;
      for (int k = 0; k < 4; ++k) p[jj][k] = _mm512_setzero_ps();
      for (int t = 0; t < NV; ++t) {
        const int d = j + 16 * t;
        const __m512 kv = _mm512_loadu_ps(kt + d * 16);
        for (int k = 0; k < 4; ++k) p[jj][k] = _mm512_fmadd_ps(_mm512_set1_ps(q[k][d]), kv, p[jj][k]);
      }
    }
    for (int k = 0; k < 4; ++k) {
      const __m512 sq = _mm512_add_ps(_mm512_add_ps(p[0][k], p[2][k]), _mm512_add_ps(p[1][k], p[3][k]));
      if (quad == 0) {
        s01[k] = sq;
      } else if (quad == 1) {
        s01[k] = _mm512_add_ps(s01[k], sq);
      } else if (quad == 2) {
        s2[k] = sq;
      } else {
        _mm512_storeu_ps(out[k], _mm512_mul_ps(_mm512_add_ps(s01[k], _mm512_add_ps(s2[k], sq)), _mm512_set1_ps(scale)));
      }
    }
  }
}
#elif defined(INTERLOCK_AVX2_MATH)
// In place: r[d] lane i <- r[i] lane d (an 8 x 8 fp32 transpose).
inline void transpose8(__m256 (&r)[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {            // pairs of rows interleaved by element
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {            // then by pairs of elements: four rows' elements j, j + 4
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int j = 0; j < 4; ++j) {               // halves: rows 0-3 and 4-7
    r[j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x20);
    r[j + 4] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x31);
  }
}

// The keys of a tile as fp32 with the keys in lanes, 8 at a time: kt[(c * D + d) * 8 + i] is
// dimension d of key 8c + i (n a multiple of 8, D of 8; the caller pads with a zero vector). A
// half cache is widened here, once per tile, instead of once per query.
template <class T>
inline void transpose_keys8(const T* const* keys, int64_t n, int64_t D, float* kt) {
  for (int64_t c = 0; c < n / 8; ++c)
    for (int64_t d0 = 0; d0 < D; d0 += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) r[i] = load8(keys[8 * c + i] + d0);
      transpose8(r);
      for (int d = 0; d < 8; ++d) _mm256_storeu_ps(kt + (c * D + d0 + d) * 8, r[d]);
    }
}

// Scores of Q queries against 16 keys at a time from transposed keys (kt, groups of 8, an even
// count): out[i][key] = (sum over d = 0 .. D - 1 in order of q[i][d] * key[d], one FMA chain from
// zero) * scale. Without AVX-512 this is the scores' arithmetic for every row count -- a decode
// row's heads too -- so a row's scores never depend on how many rows share its step. Q x 2
// accumulators, 2 key vectors and a broadcast query dim fit AVX2's 16 registers for Q <= 6; each
// key vector, loaded once, serves Q queries, and no horizontal sums are left to do.
template <int Q>
inline void scores_t(const float* const* q, const float* kt, int64_t groups, int64_t D, float scale,
                     float* const* out) {
  const __m256 sv = _mm256_set1_ps(scale);
  for (int64_t c = 0; c < groups; c += 2) {
    const float* k0 = kt + c * 8 * D;
    const float* k1 = k0 + 8 * D;
    __m256 acc[Q][2];
    for (int i = 0; i < Q; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; ++d) {
      const __m256 a = _mm256_loadu_ps(k0 + 8 * d), b = _mm256_loadu_ps(k1 + 8 * d);
      for (int i = 0; i < Q; ++i) {
        const __m256 qd = _mm256_broadcast_ss(q[i] + d);
        acc[i][0] = _mm256_fmadd_ps(qd, a, acc[i][0]);
        acc[i][1] = _mm256_fmadd_ps(qd, b, acc[i][1]);
      }
    }
    for (int i = 0; i < Q; ++i) {
      _mm256_storeu_ps(out[i] + 8 * c, _mm256_mul_ps(acc[i][0], sv));
      _mm256_storeu_ps(out[i] + 8 * c + 8, _mm256_mul_ps(acc[i][1], sv));
    }
  }
}

inline void scores_t(int nq, const float* const* q, const float* kt, int64_t groups, int64_t D, float scale,
                     float* const* out) {
  switch (nq) {
    case 1: return scores_t<1>(q, kt, groups, D, scale, out);
    case 2: return scores_t<2>(q, kt, groups, D, scale, out);
    case 3: return scores_t<3>(q, kt, groups, D, scale, out);
    case 4: return scores_t<4>(q, kt, groups, D, scale, out);
    case 5: return scores_t<5>(q, kt, groups, D, scale, out);
    default: return scores_t<6>(q, kt, groups, D, scale, out);
  }
}
#endif

// out[0:D] += p * v[0:D]
template <class T>
inline void axpy(float p, const T* v, float* out, int64_t D) {
#if defined(INTERLOCK_AVX512)
  const __m512 pv = _mm512_set1_ps(p);
  for (int64_t d = 0; d < D; d += 16)
    _mm512_storeu_ps(out + d, _mm512_fmadd_ps(pv, load16(v + d), _mm512_loadu_ps(out + d)));
#elif defined(INTERLOCK_AVX2_MATH)
  const __m256 pv = _mm256_set1_ps(p);
  for (int64_t d = 0; d < D; d += 8)
    _mm256_storeu_ps(out + d, _mm256_fmadd_ps(pv, load8(v + d), _mm256_loadu_ps(out + d)));
#else
  for (int64_t d = 0; d < D; ++d) out[d] += p * to_f32(v[d]);
#endif
}


// s[0:L] <- exp(s[0:L] - max); returns the sum, the max in *peak_out. 16 lanes at a time, the
// tail through a masked load.
inline float exp_shift_(float* s, int64_t L, float* peak_out) {
#if defined(INTERLOCK_AVX512)
  __m512 peak = _mm512_set1_ps(-INFINITY);
  for (int64_t l = 0; l < L; l += 16) {
    const __mmask16 k = l + 16 <= L ? 0xFFFF : static_cast<__mmask16>((1u << (L - l)) - 1);
    peak = _mm512_max_ps(peak, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), k, s + l));
  }
  const float top = _mm512_reduce_max_ps(peak);
  const __m512 topv = _mm512_set1_ps(top);
  __m512 total = _mm512_setzero_ps();
  for (int64_t l = 0; l < L; l += 16) {
    const __mmask16 k = l + 16 <= L ? 0xFFFF : static_cast<__mmask16>((1u << (L - l)) - 1);
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + l), topv));
    total = _mm512_add_ps(total, _mm512_maskz_mov_ps(k, e));
    _mm512_mask_storeu_ps(s + l, k, e);
  }
  *peak_out = top;
  return _mm512_reduce_add_ps(total);
#elif defined(INTERLOCK_AVX2_MATH)
  // Masked loads and stores only for the tail: on Zen 3 a masked store costs many times a plain
  // one, and this loop stores every score. The lanes and their order are the same either way.
  const int64_t full = L / 8 * 8;
  __m256 peak = _mm256_set1_ps(-INFINITY);
  for (int64_t l = 0; l < full; l += 8) peak = _mm256_max_ps(peak, _mm256_loadu_ps(s + l));
  const __m256i k = tail_mask8(L - full);
  if (full < L)
    peak = _mm256_max_ps(peak, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_maskload_ps(s + full, k),
                                                 _mm256_castsi256_ps(k)));
  const __m128 p4 = _mm_max_ps(_mm256_castps256_ps128(peak), _mm256_extractf128_ps(peak, 1));
  const __m128 p2 = _mm_max_ps(p4, _mm_movehl_ps(p4, p4));
  const float top = _mm_cvtss_f32(_mm_max_ss(p2, _mm_movehdup_ps(p2)));
  const __m256 topv = _mm256_set1_ps(top);
  __m256 total = _mm256_setzero_ps();
  for (int64_t l = 0; l < full; l += 8) {
    const __m256 e = exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(s + l), topv));
    total = _mm256_add_ps(total, e);
    _mm256_storeu_ps(s + l, e);
  }
  if (full < L) {
    const __m256 e = _mm256_and_ps(exp_nonpositive8(_mm256_sub_ps(_mm256_maskload_ps(s + full, k), topv)),
                                   _mm256_castsi256_ps(k));
    total = _mm256_add_ps(total, e);
    _mm256_maskstore_ps(s + full, k, e);
  }
  *peak_out = top;
  return sum_lanes8(total);
#else
  float top = s[0];
  for (int64_t l = 1; l < L; ++l) top = std::max(top, s[l]);
  float total = 0.f;
  for (int64_t l = 0; l < L; ++l) total += (s[l] = std::exp(s[l] - top));
  *peak_out = top;
  return total;
#endif
}

template <class T>
inline const T* kv_at(const T* cache, const int64_t* table, int64_t block_size, int64_t l, int64_t Hkv,
                          int64_t h, int64_t D) {
  return cache + ((table[l / block_size] * block_size + l % block_size) * Hkv + h) * D;
}

// out[g * out_stride + 0:D] = sum over l < L of p[g * p_stride + l] * values[l], in key order, for
// the G query heads of one KV head at once: each value vector is loaded once for all of them.
// G and NV = D / 16 are template arguments so the accumulators stay in registers (a runtime count
// spilled them to the stack, where every FMA waited on a store). Per head the FMAs are the same,
// in the same order, whatever G is: the same bits as one head alone.
template <int G, int NV, class T>
inline void weighted_sums_g(const float* p, int64_t p_stride, const T* const* values, int64_t L, float* out,
                            int64_t out_stride) {
#if defined(INTERLOCK_AVX512)
  __m512 acc[G][NV];
  for (int g = 0; g < G; ++g)
    for (int j = 0; j < NV; ++j) acc[g][j] = _mm512_setzero_ps();
  for (int64_t l = 0; l < L; ++l) {
    __m512 v[NV];
    for (int j = 0; j < NV; ++j) v[j] = load16(values[l] + 16 * j);
    for (int g = 0; g < G; ++g) {
      const __m512 pl = _mm512_set1_ps(p[g * p_stride + l]);
      for (int j = 0; j < NV; ++j) acc[g][j] = _mm512_fmadd_ps(pl, v[j], acc[g][j]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int j = 0; j < NV; ++j) _mm512_storeu_ps(out + g * out_stride + 16 * j, acc[g][j]);
#elif defined(INTERLOCK_AVX2_MATH)
  // 16 ymm registers hold G x S accumulators and S value vectors: the D dims go in slabs of S
  // vectors, each slab a pass over the keys (the values' other lines wait in L1 for the next).
  constexpr int kV = 2 * NV, kWant = G <= 2 ? 4 : (G <= 6 ? 2 : 1);
  constexpr int S = kV % kWant == 0 ? kWant : (kV % 2 == 0 ? 2 : 1);
  for (int s0 = 0; s0 < kV; s0 += S) {
    __m256 acc[G][S];
    for (int g = 0; g < G; ++g)
      for (int j = 0; j < S; ++j) acc[g][j] = _mm256_setzero_ps();
    for (int64_t l = 0; l < L; ++l) {
      __m256 v[S];
      for (int j = 0; j < S; ++j) v[j] = load8(values[l] + 8 * (s0 + j));
      for (int g = 0; g < G; ++g) {
        const __m256 pl = _mm256_broadcast_ss(p + g * p_stride + l);
        for (int j = 0; j < S; ++j) acc[g][j] = _mm256_fmadd_ps(pl, v[j], acc[g][j]);
      }
    }
    for (int g = 0; g < G; ++g)
      for (int j = 0; j < S; ++j) _mm256_storeu_ps(out + g * out_stride + 8 * (s0 + j), acc[g][j]);
  }
#else
  for (int g = 0; g < G; ++g) {
    for (int64_t d = 0; d < 16 * NV; ++d) out[g * out_stride + d] = 0.f;
    for (int64_t l = 0; l < L; ++l) axpy(p[g * p_stride + l], values[l], out + g * out_stride, 16 * NV);
  }
#endif
}

// The (G, D) shapes weighted_sums holds in registers for all G heads at once.
inline bool unrolled_sums(int64_t G, int64_t D) {
  return (D == 64 && G >= 2 && G <= 6 && G != 5) || (D == 128 && G == 2) || (D == 16 && (G == 2 || G == 4));
}

// The same for any G and D: unrolled shapes where one exists (unrolled_sums), else head by head
// (unrolled D where possible, else a plain loop).
template <class T>
inline void weighted_sums(const float* p, int64_t p_stride, const T* const* values, int64_t L, int64_t G,
                          int64_t D, float* out, int64_t out_stride) {
#define INTERLOCK_WS(GG, NV) \
  if (G == GG && D == 16 * NV) return weighted_sums_g<GG, NV, T>(p, p_stride, values, L, out, out_stride)
  INTERLOCK_WS(2, 4); INTERLOCK_WS(3, 4); INTERLOCK_WS(4, 4); INTERLOCK_WS(6, 4);     // D = 64
  INTERLOCK_WS(2, 8);                                            // D = 128
  INTERLOCK_WS(2, 1); INTERLOCK_WS(4, 1);                         // D = 16 (tests)
#undef INTERLOCK_WS
  for (int64_t g = 0; g < G; ++g) {
    const float* pg = p + g * p_stride;
    float* og = out + g * out_stride;
    switch (D / 16) {
      case 1: weighted_sums_g<1, 1, T>(pg, 0, values, L, og, 0); continue;
      case 2: weighted_sums_g<1, 2, T>(pg, 0, values, L, og, 0); continue;
      case 3: weighted_sums_g<1, 3, T>(pg, 0, values, L, og, 0); continue;
      case 4: weighted_sums_g<1, 4, T>(pg, 0, values, L, og, 0); continue;
      case 8: weighted_sums_g<1, 8, T>(pg, 0, values, L, og, 0); continue;
      default:
        for (int64_t d = 0; d < D; ++d) og[d] = 0.f;
        for (int64_t l = 0; l < L; ++l) axpy(pg[l], values[l], og, D);
    }
  }
}

// Row attention, split into fixed tiles of keys (flash-decoding).
//
// The rows of one sequence are consecutive tokens: row r, at position pos0 + r, attends over
// positions 0 .. pos0 + r. The work is cut into tasks (sequence, KV head, tile of kTile keys):
// a task reads its keys and values once for all the sequence's rows (a verify step does not
// re-read the context per row) and leaves, per (row, query head), the tile's max score, its sum
// of exp(score - max) and the exp-weighted sum of values. A second pass combines a row's tiles
// in tile order. Tile boundaries are multiples of kTile from position 0, so a row's arithmetic
// depends on its own position only: bitwise the same alone or in a batch, and the tiles keep both
// cores busy at batch 1 (a 1,000-token context is 8 tiles per head).
constexpr int64_t kTile = 128;
// Queries on a tile (rows x query heads per KV head) from which, with AVX-512, its keys are
// transposed once and scored four queries at a time (see scores16_x4).
constexpr int64_t kTransposedQueries = 8;

struct SeqRows {
  const float* q;          // row r's query heads at q + r * q_stride, [H, D]
  int64_t q_stride;
  int64_t n;               // rows
  int64_t pos0;            // position of row 0
  const int64_t* table;    // block table
  float* out;              // row r's output at out + r * out_stride, [H, D]
  int64_t out_stride;
};

template <class T>
inline void attend_rows(const std::vector<SeqRows>& seqs, int64_t H, int64_t D, const T* kp, const T* vp,
                        int64_t Hkv, int64_t block_size, float scale, int64_t window = 0) {
  const int64_t G = H / Hkv;
  // The first key row r of a sequence sees: 0, or with a window the oldest of its last W positions.
  auto first_key = [window](const SeqRows& sq, int64_t r) {
    return window > 0 ? std::max<int64_t>(0, sq.pos0 + r + 1 - window) : int64_t{0};
  };
  struct Task { int64_t seq, h, tile, part; };
  std::vector<Task> tasks;
  std::vector<int64_t> first_part(seqs.size());      // partial index of (seq, head 0, its first tile)
  std::vector<int64_t> first_tile(seqs.size());      // the first tile any row of the sequence sees
  int64_t parts = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int64_t t0 = first_key(seqs[s], 0) / kTile, t1 = (seqs[s].pos0 + seqs[s].n + kTile - 1) / kTile;
    first_part[s] = parts;
    first_tile[s] = t0;
    for (int64_t h = 0; h < Hkv; ++h)
      for (int64_t j = t0; j < t1; ++j) tasks.push_back({static_cast<int64_t>(s), h, j, parts++});
  }
  // Per partial and (row, query head of the KV head): max, sum, then D values.
  std::vector<int64_t> part_offset(parts + 1, 0);
  for (const Task& t : tasks) part_offset[t.part + 1] = seqs[t.seq].n * G * (2 + D);
  for (int64_t i = 0; i < parts; ++i) part_offset[i + 1] += part_offset[i];
  // Not zeroed (a 256-row chunk at 2,000 tokens has ~10 MB of partials): every slot the combine
  // reads is written below, a tile's D values by weighted_sums for each row that sees it.
  const std::unique_ptr<float[]> partial(new float[part_offset[parts]]);

  at::parallel_for(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> scores, kt, sink(kTile);
    const std::vector<T> zeros(D, T(0.f));
    const T* keys[kTile];
    const T* values[kTile];
    for (int64_t ti = t0; ti < t1; ++ti) {
      const Task& t = tasks[ti];
      const SeqRows& sq = seqs[t.seq];
      const int64_t l0 = t.tile * kTile, l1 = std::min(l0 + kTile, sq.pos0 + sq.n);
      const int64_t r0 = std::max<int64_t>(0, l0 - sq.pos0);       // rows that reach this tile
      // The tile's key and value vectors, looked up in the block table once per block, and
      // prefetched into L2: the hardware prefetchers missed much of this (one head's 256 bytes
      // of every 768, block by block), which left decode at 1,000 tokens waiting on loads.
      for (int64_t l = l0; l < l1;) {
        const int64_t b = l / block_size, end = std::min(l1, (b + 1) * block_size);
        const T* k0 = kv_at(kp, sq.table, block_size, l, Hkv, t.h, D);
        const T* v0 = kv_at(vp, sq.table, block_size, l, Hkv, t.h, D);
        for (int64_t i = 0; l < end; ++l, ++i) {
          keys[l - l0] = k0 + i * Hkv * D;
          values[l - l0] = v0 + i * Hkv * D;
        }
      }
      for (int64_t i = 0; i < l1 - l0; ++i)
        for (int64_t byte = 0; byte < D * static_cast<int64_t>(sizeof(T)); byte += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(keys[i]) + byte, _MM_HINT_T1);
          _mm_prefetch(reinterpret_cast<const char*>(values[i]) + byte, _MM_HINT_T1);
        }
      for (int64_t l = l1; l < l0 + kTile && (l - l0) % 16 != 0; ++l) keys[l - l0] = zeros.data();
      scores.resize(sq.n * G * kTile);
      // Row r sees the tile's keys [begin_of(r), len_of(r)) (offsets in the tile); scores are
      // computed from the tile's start, so a key's score never depends on the window.
      auto len_of = [&](int64_t r) { return std::min(l1, sq.pos0 + r + 1) - l0; };
      auto begin_of = [&](int64_t r) { return std::max<int64_t>(0, first_key(sq, r) - l0); };
      auto sees = [&](int64_t r) { return r >= r0 && begin_of(r) < len_of(r); };
      // Scores 16 keys at a time from the tile's start; a row's keys past its own position are
      // computed with the others' and never used. With AVX-512 and many queries on the tile (a
      // verify step's or a prompt chunk's rows) the keys are transposed once and scored four queries
      // at a time (scores16_x4, the same bits as scores16); a decode row's three heads would not
      // repay the transpose. With AVX2 every row count takes the transposed keys (scores_t).
#if defined(INTERLOCK_AVX2_MATH)
      {
        const int64_t groups = (l1 - l0 + 15) / 16 * 2;
        kt.resize(groups * 8 * D);
        transpose_keys8(keys, groups * 8, D, kt.data());
        const int64_t nq = (sq.n - r0) * G;
        for (int64_t b = 0; b < nq; b += 6) {
          const int n = static_cast<int>(std::min<int64_t>(6, nq - b));
          const float* qs[6];
          float* outs[6];
          int64_t need = 0;
          for (int k = 0; k < n; ++k) {
            const int64_t qi = b + k, r = r0 + qi / G, g = qi % G;
            qs[k] = sq.q + r * sq.q_stride + (t.h * G + g) * D;
            outs[k] = scores.data() + (r * G + g) * kTile;
            need = std::max(need, len_of(r));
          }
          scores_t(n, qs, kt.data(), (need + 15) / 16 * 2, D, scale, outs);
        }
      }
#else
#if defined(INTERLOCK_AVX512)
      if ((sq.n - r0) * G >= kTransposedQueries && (D == 64 || D == 128)) {
        const int64_t groups = (l1 - l0 + 15) / 16;
        kt.resize(groups * 16 * D);
        transpose_keys(keys, groups * 16, D, kt.data());
        const int64_t nq = (sq.n - r0) * G;
        for (int64_t b = 0; b < nq; b += 4) {
          const float* qs[4];
          float* outs[4];
          int64_t need = 0;
          for (int k = 0; k < 4; ++k) {
            const int64_t qi = std::min(b + k, nq - 1), r = r0 + qi / G, g = qi % G;
            qs[k] = sq.q + r * sq.q_stride + (t.h * G + g) * D;
            outs[k] = b + k < nq ? scores.data() + (r * G + g) * kTile : sink.data();   // a padding query
            need = std::max(need, len_of(r));
          }
          for (int64_t c = 0; c < (need + 15) / 16; ++c) {
            float* const at[4] = {outs[0] + 16 * c, outs[1] + 16 * c, outs[2] + 16 * c, outs[3] + 16 * c};
            if (D == 64) scores16_x4<4>(qs, kt.data() + c * 16 * D, scale, at);
            else scores16_x4<8>(qs, kt.data() + c * 16 * D, scale, at);
          }
        }
      } else
#endif
      for (int64_t r = r0; r < sq.n; ++r) {
        if (!sees(r)) continue;
        const int64_t len = len_of(r);
        for (int64_t g = 0; g < G; ++g)
          for (int64_t i = 0; i < len; i += 16)
            scores16(sq.q + r * sq.q_stride + (t.h * G + g) * D, keys + i, D, scale,
                     scores.data() + (r * G + g) * kTile + i);
      }
#endif
      float* part = partial.get() + part_offset[t.part];
      for (int64_t r = 0; r < sq.n; ++r) {
        if (!sees(r)) {                               // the row ends before this tile, or its window starts after it
          for (int64_t g = 0; g < G; ++g) {
            part[(r * G + g) * (2 + D)] = -INFINITY;
            part[(r * G + g) * (2 + D) + 1] = 0.f;
          }
          continue;
        }
        const int64_t begin = begin_of(r);
        for (int64_t g = 0; g < G; ++g) {
          float* slot = part + (r * G + g) * (2 + D);
          slot[1] = exp_shift_(scores.data() + (r * G + g) * kTile + begin, len_of(r) - begin, slot);
        }
      }
      // Two rows that see the same keys (the tile lies wholly inside both their ranges) share
      // each value vector's load: their 2G heads go through weighted_sums at once, where the
      // register-held shape exists. Per head the sums are the same either way.
      const bool pairs = unrolled_sums(2 * G, D);
      for (int64_t r = r0; r < sq.n;) {
        if (!sees(r)) {
          ++r;
          continue;
        }
        const int64_t len = len_of(r), begin = begin_of(r);
        const int64_t rows = pairs && r + 1 < sq.n && len_of(r + 1) == len && begin_of(r + 1) == begin ? 2 : 1;
        weighted_sums(scores.data() + r * G * kTile + begin, kTile, values + begin, len - begin, rows * G, D,
                      part + r * G * (2 + D) + 2, 2 + D);
        r += rows;
      }
    }
  });

  // Combine: out = sum_j exp(m_j - m) * acc_j / sum_j exp(m_j - m) * s_j, tiles in order.
  std::vector<std::pair<int64_t, int64_t>> rows;      // (seq, row)
  for (size_t s = 0; s < seqs.size(); ++s)
    for (int64_t r = 0; r < seqs[s].n; ++r) rows.emplace_back(static_cast<int64_t>(s), r);
  at::parallel_for(0, static_cast<int64_t>(rows.size()) * H, 8, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const auto [s, r] = rows[i / H];
      const int64_t head = i % H, h = head / G, g = head % G;
      const SeqRows& sq = seqs[s];
      const int64_t lo = first_key(sq, r) / kTile, hi = (sq.pos0 + r) / kTile + 1;    // the tiles row r sees
      const int64_t all_tiles = (sq.pos0 + sq.n + kTile - 1) / kTile - first_tile[s];
      auto slot = [&](int64_t j) {
        return partial.get() + part_offset[first_part[s] + h * all_tiles + j - first_tile[s]] + (r * G + g) * (2 + D);
      };
      float top = -INFINITY;
      for (int64_t j = lo; j < hi; ++j) top = std::max(top, slot(j)[0]);
      float total = 0.f;
      float* o = sq.out + r * sq.out_stride + head * D;
      for (int64_t d = 0; d < D; ++d) o[d] = 0.f;
      for (int64_t j = lo; j < hi; ++j) {
        const float w = std::exp(slot(j)[0] - top);
        total += w * slot(j)[1];
        axpy(w, slot(j) + 2, o, D);
      }
      const float inv = 1.f / total;
      for (int64_t d = 0; d < D; ++d) o[d] *= inv;
    }
  });
}

}  // namespace interlock_cpu
