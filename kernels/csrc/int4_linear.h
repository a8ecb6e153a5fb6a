#pragma once
// y[M, N] = x[M, K] . W[N, K]^T with 4-bit weights (kernels/int4_pack.py), K a multiple of 64. The
// CPU decode / verify projections and prompt chunks of a model loaded with weights="int4".
//
// Why 4 bits: decoding a token reads every weight once, so at the sizes people run (1B-8B) a step is
// bound by memory bandwidth, and these ~4.8 bits a weight read 0.57x the bytes of int8 with per-row
// scales. Q4_K GGUF blocks map onto the format exactly (but for the fp16 rounding of the offsets),
// Q4_0 / Q4_1 up to an 8-bit sub-scale, anything else is quantized from its floats.
//
// Format. Along K, super-blocks of 256 weights (the last one 64, 128 or 192 where K % 256 != 0), each
// split in blocks of 32. A weight is w = D * sc_b * q + o_b: q in 0..15, sc_b an int8 sub-scale per
// block, D an fp16 scale per super-block, o_b an fp16 offset per block. Two tensors per matrix:
//   records [N, row bytes]: per super-block of W weights, W / 2 bytes of nibbles, W / 32 int8
//     sub-scales, fp16 D. Nibbles pair two 64-weight chunks in 64 bytes (byte i: weight i of the pair
//     in its low nibble, 64 + i in its high one); a last unpaired chunk takes 32 bytes (byte i:
//     weights i and 32 + i).
//   offsets [N, K / 32] fp16.
// Activations: int8, per super-block one fp32 scale A_g = amax / 127 and per block of 32 an exponent
// e_b in 0..7, the largest with 2^e_b * (the block's amax) <= the super-block's amax: block b's scale
// is A_g / 2^e_b. So a block of small values keeps (within a factor 2) the resolution of its own
// scale, and a super-block's products still sum in integers. (One scale per super-block, as
// llama.cpp's Q8_K, lost small blocks' resolution: on Gemma 3 270M with float weights it had ~3x the
// top-5 logprob error of a scale per block; these exponents land near the latter.)
//
// Arithmetic, per (row m, output n):
//   main: 16 lanes; lane l of chunk c covers the chunk's weights 4l .. 4l + 3 (block b = 2c + l / 8).
//     Per super-block g, isum_l = sum over its chunks of (sc_b * 2^(7 - e_b)) * (the lane's 4 products
//     q * xq), exact in int32 (|sc * 2^(7 - e)| <= 16256 fits the int16 dpwssd multiplies); then
//     acc_l = fma(float(isum_l), D_g * A_g / 128, acc_l) (fp32), super-block by super-block in K order;
//   offsets: sum over blocks of o_b * ((A_g / 2^e_b) * xsum_b) (xsum_b: the block's int8 activations
//     summed), in 16 fp32 lanes, lane j taking blocks j, j + 16, ... by fma in K order;
//   y = halving tree(main) + halving tree(offsets).
// Per chunk and row that is 3 SIMD ops on VNNI (maddubs, a permute of the multipliers, dpwssd) where
// per-block fp32 scales took 4 (dpbusd, convert, multiply, fma), and the offsets (one fma per chunk
// inside the loop) cost one fma per 16 blocks in their own pass. Two or more rows on VNNI take
// int4_rows.h instead: weights and activations widened to int16 once, 2 dpwssd per chunk and row.
// Every SIMD kernel computes these same integers and fp32 operations, so all give the portable
// kernel's bits, and a row's result depends on that row alone (batch invariant).
#include <ATen/Parallel.h>

#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "int8_avx2.h"     // halving_sum_avx2: the 16-lane tree both kernels end with
#include "simd.h"

namespace interlock_cpu {

constexpr int64_t kI4Super = 256;          // weights per super-block (the last may be shorter)
constexpr int64_t kI4Block = 32;           // weights per sub-scale and offset
constexpr int64_t kI4Chunk = 64;           // weights per SIMD dot
constexpr int64_t kI4Lanes = 16;
constexpr int64_t kI4Prefetch = 8192;      // bytes ahead of each row's read, into L2 (as the int8 VNNI kernel)

inline float half_to_float(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

// Where super-block g of a row starts, and its weights.
inline int64_t i4_super_weights(int64_t K, int64_t g) { return std::min(kI4Super, K - g * kI4Super); }
inline int64_t i4_super_bytes(int64_t W) { return W / 2 + W / kI4Block + 2; }
inline int64_t i4_row_bytes(int64_t K) {
  const int64_t full = K / kI4Super, tail = K % kI4Super;
  return full * i4_super_bytes(kI4Super) + (tail ? i4_super_bytes(tail) : 0);
}

// The activation rows as the int4 kernels read them: int8 values [M, K], one scale per super-block
// [M, G], per block 2^(7 - e_b) [M, K / 32] and (A_g / 2^e_b) * float(xsum_b) [M, K / 32] (the
// offsets' factor).
struct I4Rows {
  int64_t K = 0, G = 0, B = 0;
  std::vector<int8_t> q;
  std::vector<float> scale, bsum;
  std::vector<int16_t> pow2;
  const int8_t* qs(int64_t m) const { return q.data() + m * K; }
  const int16_t* pow2s(int64_t m) const { return pow2.data() + m * B; }
};

// Per super-block A = amax / 127; per block e (above) and values round(x * ((127 / amax) * 2^e)) to
// nearest even (within +-127). A zero super-block: scale 0, values 0. A NaN makes the scale NaN and
// the values 0, so the row's outputs are NaN. One super-block of W values v: its scale, and per block
// its 2^(7 - e) and (A / 2^e) * xsum.
inline void i4_quantize_super(const float* v, int64_t W, int8_t* q, float& scale_out, int16_t* pow2, float* bsum) {
  float amax = 0.f;
  for (int64_t i = 0; i < W; ++i) {
    const float a = std::fabs(v[i]);
    if (a > amax || std::isnan(a)) amax = a;
    if (std::isnan(amax)) break;
  }
  const float scale = std::isnan(amax) ? amax : amax / 127.f;
  const float inv = amax > 0.f && !std::isnan(amax) ? 127.f / amax : 0.f;
  scale_out = scale;
  for (int64_t b = 0; b < W / kI4Block; ++b) {
    const float* vb = v + b * kI4Block;
    int8_t* qb = q + b * kI4Block;
    float bmax = 0.f;
    for (int64_t i = 0; i < kI4Block; ++i) bmax = std::max(bmax, std::fabs(vb[i]));
    int e = 0;
    while (e < 7 && bmax * static_cast<float>(2 << e) <= amax) ++e;     // 2^(e+1) * bmax still fits
    const float ib = inv * static_cast<float>(1 << e);
    int32_t sum = 0;
    for (int64_t i = 0; i < kI4Block; ++i) {
      qb[i] = static_cast<int8_t>(std::nearbyint(vb[i] * ib));
      sum += qb[i];
    }
    pow2[b] = static_cast<int16_t>(1 << (7 - e));
    bsum[b] = scale / static_cast<float>(1 << e) * static_cast<float>(sum);
  }
}

#if defined(INTERLOCK_AVX512)
// i4_quantize_super in 16 lanes, with its bits: maxima do not depend on their order, the products
// are the same fp32 multiplies, cvtps rounds to nearest even as nearbyint does (the default mode),
// and integer sums are exact. A super-block with a NaN or an infinity takes the scalar code.
inline void i4_quantize_super_simd(const float* v, int64_t W, int8_t* q, float& scale_out, int16_t* pow2,
                                   float* bsum) {
  const int64_t blocks = W / kI4Block;
  float bmax[8];
  __m512 peak = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const __m512 m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(v + b * kI4Block)),
                                   _mm512_abs_ps(_mm512_loadu_ps(v + b * kI4Block + 16)));
    bmax[b] = _mm512_reduce_max_ps(m);
    peak = _mm512_max_ps(peak, m);          // max_ps drops a NaN in its first operand: checked below
  }
  const float amax = _mm512_reduce_max_ps(peak);
  bool finite = std::isfinite(amax);
  for (int64_t b = 0; b < blocks && finite; ++b) finite = std::isfinite(bmax[b]);
  __mmask16 odd = 0;
  for (int64_t i = 0; i < W && finite; i += 16) {
    const __m512 x = _mm512_loadu_ps(v + i);
    odd |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  }
  if (!finite || odd) {
    i4_quantize_super(v, W, q, scale_out, pow2, bsum);
    return;
  }
  const float scale = amax / 127.f;
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  scale_out = scale;
  for (int64_t b = 0; b < blocks; ++b) {
    int e = 0;
    while (e < 7 && bmax[b] * static_cast<float>(2 << e) <= amax) ++e;
    const __m512 ib = _mm512_set1_ps(inv * static_cast<float>(1 << e));
    const __m512i lo = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(v + b * kI4Block), ib));
    const __m512i hi = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(v + b * kI4Block + 16), ib));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kI4Block), _mm512_cvtepi32_epi8(lo));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kI4Block + 16), _mm512_cvtepi32_epi8(hi));
    const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(lo, hi));
    pow2[b] = static_cast<int16_t>(1 << (7 - e));
    bsum[b] = scale / static_cast<float>(1 << e) * static_cast<float>(sum);
  }
}
#endif

inline void i4_quantize(const float* x, int64_t M, int64_t K, I4Rows& out) {
  out.K = K;
  out.G = (K + kI4Super - 1) / kI4Super;
  out.B = K / kI4Block;
  out.q.resize(M * K);
  out.scale.resize(M * out.G);
  out.bsum.resize(M * out.B);
  out.pow2.resize(M * out.B);
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m)
      for (int64_t g = 0; g < out.G; ++g) {
        const int64_t k0 = g * kI4Super, at = m * out.B + k0 / kI4Block;
#if defined(INTERLOCK_AVX512)
        i4_quantize_super_simd(
#else
        i4_quantize_super(
#endif
            x + m * K + k0, i4_super_weights(K, g), out.q.data() + m * K + k0, out.scale[m * out.G + g],
            out.pow2.data() + at, out.bsum.data() + at);
      }
  });
}

// Weight k (0 .. 63) of chunk j (0 .. W / 64 - 1) of a super-block whose nibbles start at p.
inline int32_t i4_weight(const uint8_t* p, int64_t W, int64_t j, int64_t k) {
  const int64_t chunks = W / kI4Chunk;
  if (j % 2 == 0 && j == chunks - 1)                          // the unpaired last chunk
    return k < 32 ? (p[32 * j + k] & 0x0F) : (p[32 * j + k - 32] >> 4);
  const uint8_t byte = p[32 * (j - j % 2) + k];
  return j % 2 == 0 ? (byte & 0x0F) : (byte >> 4);
}

// The portable kernel (INTERLOCK_SIMD=0, or a CPU with neither AVX2 nor VNNI): what each SIMD kernel
// must equal bit for bit.
inline float i4_main_portable(const I4Rows& a, const uint8_t* row, int64_t m) {
  float acc[kI4Lanes] = {};
  const uint8_t* rec = row;
  for (int64_t g = 0; g < a.G; ++g) {
    const int64_t W = i4_super_weights(a.K, g);
    const int8_t* sc = reinterpret_cast<const int8_t*>(rec + W / 2);
    const float DA = half_to_float(rec + W / 2 + W / kI4Block) * a.scale[m * a.G + g] * (1.f / 128);
    const int8_t* xq = a.qs(m) + g * kI4Super;
    const int16_t* p2 = a.pow2s(m) + g * (kI4Super / kI4Block);
    int32_t isum[kI4Lanes] = {};
    for (int64_t j = 0; j < W / kI4Chunk; ++j)
      for (int64_t l = 0; l < kI4Lanes; ++l) {
        int32_t dot = 0;
        for (int64_t i = 0; i < 4; ++i) dot += i4_weight(rec, W, j, 4 * l + i) * xq[j * kI4Chunk + 4 * l + i];
        isum[l] += sc[2 * j + l / 8] * p2[2 * j + l / 8] * dot;
      }
    for (int64_t l = 0; l < kI4Lanes; ++l) acc[l] = std::fma(static_cast<float>(isum[l]), DA, acc[l]);
    rec += i4_super_bytes(W);
  }
  for (int64_t h = kI4Lanes / 2; h > 0; h /= 2)
    for (int64_t l = 0; l < h; ++l) acc[l] += acc[l + h];
  return acc[0];
}

inline float i4_offsets_portable(const c10::Half* off, const float* bsum, int64_t B) {
  float acc[kI4Lanes] = {};
  for (int64_t b = 0; b < B; ++b) acc[b % kI4Lanes] = std::fma(static_cast<float>(off[b]), bsum[b], acc[b % kI4Lanes]);
  for (int64_t h = kI4Lanes / 2; h > 0; h /= 2)
    for (int64_t l = 0; l < h; ++l) acc[l] += acc[l + h];
  return acc[0];
}

// A super-block's sub-scales as 8 int16 (unused ones 0), read without passing its own bytes.
inline void i4_subscales(const uint8_t* p, int64_t W, int16_t out[8]) {
  int8_t sc[8] = {};
  std::memcpy(sc, p, W / kI4Block);
  for (int i = 0; i < 8; ++i) out[i] = sc[i];
}

#if defined(INTERLOCK_VNNI)

inline float i4_offsets(const c10::Half* off, const float* bsum, int64_t B) {
  __m512 acc = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 16 <= B; b += 16)
    acc = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(off + b))),
                          _mm512_loadu_ps(bsum + b), acc);
  if (b < B) {                          // a masked fma: lanes past the end keep their value, as above
    const __mmask16 k = static_cast<__mmask16>((1u << (B - b)) - 1);
    const __m512 o = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, off + b));
    acc = _mm512_mask3_fmadd_ps(o, _mm512_maskz_loadu_ps(k, bsum + b), acc, k);
  }
  return _mm512_reduce_add_ps(acc);
}

// The int16 sub-scale vectors of chunks 2p and 2p + 1 (pair p) from a super-block's 8 sub-scales:
// int16 lanes 0-15 take sub-scale 2j, 16-31 take 2j + 1 (dpwssd's int32 lane l reads int16 2l, 2l + 1).
inline __m512i i4_pick(int j) {
  return _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_set1_epi16(static_cast<int16_t>(2 * j)),
                                 _mm512_set1_epi16(static_cast<int16_t>(2 * j + 1)));
}

// Chunk j of a super-block of output n (q: its 64 nibble values) against MB activation rows (xq:
// their super-block's values; mult: per row the super-block's 8 multipliers sc_b * 2^(7 - e_b), which
// `pick` spreads over chunk j's int16 lanes).
template <int MB>
inline void i4_chunk(__m512i q, __m512i pick, const int8_t* const (&xq)[MB], const __m512i (&mult)[MB], int64_t j,
                     __m512i (&isum)[MB]) {
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m)
    isum[m] = _mm512_dpwssd_epi32(isum[m], _mm512_maddubs_epi16(q, _mm512_loadu_si512(xq[m] + 64 * j)),
                                  _mm512_permutexvar_epi16(pick, mult[m]));
}

// 8 int16 from p where only the first n are the super-block's own (a row's last super-block).
inline __m128i i4_load8(const void* p, int64_t n, bool bytes) {
  const __mmask16 k = static_cast<__mmask16>((1u << n) - 1);
  return bytes ? _mm_cvtepi8_epi16(_mm_maskz_loadu_epi8(k, p)) : _mm_maskz_loadu_epi16(static_cast<__mmask8>(k), p);
}

// NB outputs x MB rows over every super-block: per output, each pair of chunks is unpacked once (one
// 64-byte load, two masks) and every row's activations stream past it.
template <int NB, int MB>
inline void i4_block(const I4Rows& a, const uint8_t* w, int64_t stride, float* main, int64_t n0, int64_t m0,
                     int64_t N) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  const __m512i pick0 = i4_pick(0), pick1 = i4_pick(1), pick2 = i4_pick(2), pick3 = i4_pick(3);
  __m512 acc[NB][MB];
#pragma GCC unroll 8
  for (int n = 0; n < NB; ++n)
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) acc[n][m] = _mm512_setzero_ps();
  int64_t offset = 0;
  for (int64_t g = 0; g < a.G; ++g) {
    const int64_t W = i4_super_weights(a.K, g), chunks = W / kI4Chunk, blocks = W / kI4Block;
    const int8_t* xq[MB];
    __m128i p2[MB];
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      xq[m] = a.qs(m0 + m) + g * kI4Super;
      p2[m] = i4_load8(a.pow2s(m0 + m) + g * (kI4Super / kI4Block), blocks, false);
    }
#pragma GCC unroll 8
    for (int n = 0; n < NB; ++n) {
      const uint8_t* rec = w + (n0 + n) * stride + offset;
      _mm_prefetch(reinterpret_cast<const char*>(rec + kI4Prefetch), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(rec + kI4Prefetch + 64), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(rec + kI4Prefetch + 128), _MM_HINT_T1);   // 138 bytes: 3 lines
      const __m128i sc = i4_load8(rec + W / 2, blocks, true);
      __m512i mult[MB], isum[MB];
#pragma GCC unroll 8
      for (int m = 0; m < MB; ++m) {
        mult[m] = _mm512_castsi128_si512(_mm_mullo_epi16(sc, p2[m]));
        isum[m] = _mm512_setzero_si512();
      }
      if (chunks == 4) {                                   // a whole super-block: two pairs
        const __m512i v0 = _mm512_loadu_si512(rec), v1 = _mm512_loadu_si512(rec + 64);
        i4_chunk<MB>(_mm512_and_si512(v0, low), pick0, xq, mult, 0, isum);
        i4_chunk<MB>(_mm512_and_si512(_mm512_srli_epi16(v0, 4), low), pick1, xq, mult, 1, isum);
        i4_chunk<MB>(_mm512_and_si512(v1, low), pick2, xq, mult, 2, isum);
        i4_chunk<MB>(_mm512_and_si512(_mm512_srli_epi16(v1, 4), low), pick3, xq, mult, 3, isum);
      } else {                                             // a row's last, shorter super-block
        for (int64_t j = 0; j + 1 < chunks; j += 2) {
          const __m512i v = _mm512_loadu_si512(rec + 32 * j);
          i4_chunk<MB>(_mm512_and_si512(v, low), i4_pick(j), xq, mult, j, isum);
          i4_chunk<MB>(_mm512_and_si512(_mm512_srli_epi16(v, 4), low), i4_pick(j + 1), xq, mult, j + 1, isum);
        }
        if (chunks % 2) {
          const int64_t j = chunks - 1;
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 32 * j));
          const __m256i l4 = _mm256_set1_epi8(0x0F);
          const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, l4)),
                                               _mm256_and_si256(_mm256_srli_epi16(v, 4), l4), 1);
          i4_chunk<MB>(q, i4_pick(j), xq, mult, j, isum);
        }
      }
      const float D = _cvtsh_ss(*reinterpret_cast<const uint16_t*>(rec + W / 2 + W / kI4Block));
#pragma GCC unroll 8
      for (int m = 0; m < MB; ++m)
        acc[n][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[m]),
                                    _mm512_set1_ps(D * a.scale[(m0 + m) * a.G + g] * (1.f / 128)), acc[n][m]);
    }
    offset += i4_super_bytes(W);
  }
#pragma GCC unroll 8
  for (int n = 0; n < NB; ++n)
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) main[(m0 + m) * N + n0 + n] = _mm512_reduce_add_ps(acc[n][m]);
}

#elif defined(INTERLOCK_AVX2)

// 8 blocks' offsets from o (fewer with n < 8: those lanes keep acc's value, as the portable loop
// leaves them).
inline __m256 i4_offsets_half(const c10::Half* o, const float* s, int64_t n, __m256 acc) {
  if (n >= 8)
    return _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(o))), _mm256_loadu_ps(s), acc);
  if (n <= 0) return acc;
  alignas(32) c10::Half ob[8] = {};
  alignas(32) float sb[8] = {};
  std::memcpy(ob, o, n * sizeof(c10::Half));
  std::memcpy(sb, s, n * sizeof(float));
  const __m256 f = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(ob))),
                                   _mm256_load_ps(sb), acc);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_blendv_ps(acc, f, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), lane)));
}

inline float i4_offsets(const c10::Half* off, const float* bsum, int64_t B) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  for (int64_t b = 0; b < B; b += 16) {
    lo = i4_offsets_half(off + b, bsum + b, B - b, lo);
    hi = i4_offsets_half(off + b + 8, bsum + b + 8, B - b - 8, hi);
  }
  return halving_sum_avx2(lo, hi);
}

// One 32-weight block's lanes (8 of the 16): maddubs into int16 pairs (at most 2 * 15 * 127), madd by
// the block's multiplier sc * 2^(7 - e) into the lanes' int32 (exact).
inline __m256i i4_block_dot(__m256i q, const int8_t* xq, __m256i sc, __m256i isum) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
  return _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), sc));
}

template <int NB, int MB>
inline void i4_block(const I4Rows& a, const uint8_t* w, int64_t stride, float* main, int64_t n0, int64_t m0,
                     int64_t N) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  __m256 lo[NB][MB], hi[NB][MB];
  for (int n = 0; n < NB; ++n)
    for (int m = 0; m < MB; ++m) lo[n][m] = hi[n][m] = _mm256_setzero_ps();
  int64_t offset = 0;
  for (int64_t g = 0; g < a.G; ++g) {
    const int64_t W = i4_super_weights(a.K, g), chunks = W / kI4Chunk;
    for (int n = 0; n < NB; ++n) {
      const uint8_t* rec = w + (n0 + n) * stride + offset;
      int16_t sc[8];
      i4_subscales(rec + W / 2, W, sc);
      __m256i ilo[MB], ihi[MB];
      for (int m = 0; m < MB; ++m) ilo[m] = ihi[m] = _mm256_setzero_si256();
      for (int64_t j = 0; j < chunks; ++j) {
        // chunk j's two blocks: weights 0-31 and 32-63 of the chunk, as 32 nibbles each
        __m256i b0, b1;
        if (j % 2 == 0 && j == chunks - 1) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 32 * j));
          b0 = _mm256_and_si256(v, low);
          b1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        } else {
          const uint8_t* p = rec + 32 * (j - j % 2);
          const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
          const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32));
          b0 = j % 2 == 0 ? _mm256_and_si256(v0, low) : _mm256_and_si256(_mm256_srli_epi16(v0, 4), low);
          b1 = j % 2 == 0 ? _mm256_and_si256(v1, low) : _mm256_and_si256(_mm256_srli_epi16(v1, 4), low);
        }
        const __m256i s0 = _mm256_set1_epi16(sc[2 * j]), s1 = _mm256_set1_epi16(sc[2 * j + 1]);
#pragma GCC unroll 4
        for (int m = 0; m < MB; ++m) {
          const int8_t* xq = a.qs(m0 + m) + g * kI4Super + j * kI4Chunk;
          const int16_t* p2 = a.pow2s(m0 + m) + g * (kI4Super / kI4Block) + 2 * j;
          ilo[m] = i4_block_dot(b0, xq, _mm256_mullo_epi16(s0, _mm256_set1_epi16(p2[0])), ilo[m]);
          ihi[m] = i4_block_dot(b1, xq + 32, _mm256_mullo_epi16(s1, _mm256_set1_epi16(p2[1])), ihi[m]);
        }
      }
      const float D = half_to_float(rec + W / 2 + W / kI4Block);
#pragma GCC unroll 4
      for (int m = 0; m < MB; ++m) {
        const __m256 da = _mm256_set1_ps(D * a.scale[(m0 + m) * a.G + g] * (1.f / 128));
        lo[n][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ilo[m]), da, lo[n][m]);
        hi[n][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ihi[m]), da, hi[n][m]);
      }
    }
    offset += i4_super_bytes(W);
  }
  for (int n = 0; n < NB; ++n)
    for (int m = 0; m < MB; ++m) main[(m0 + m) * N + n0 + n] = halving_sum_avx2(lo[n][m], hi[n][m]);
}

#else

inline float i4_offsets(const c10::Half* off, const float* bsum, int64_t B) { return i4_offsets_portable(off, bsum, B); }

template <int NB, int MB>
inline void i4_block(const I4Rows& a, const uint8_t* w, int64_t stride, float* main, int64_t n0, int64_t m0,
                     int64_t N) {
  for (int n = 0; n < NB; ++n)
    for (int m = 0; m < MB; ++m) main[(m0 + m) * N + n0 + n] = i4_main_portable(a, w + (n0 + n) * stride, m0 + m);
}

#endif

// Outputs n0 .. n0 + NB for all M rows, MB rows at a time (the block's records come from memory
// for the first group and from L1 / L2 after it), each finished with its offsets pass.
template <int NB, int MB>
inline void i4_rows(const I4Rows& a, const uint8_t* w, const c10::Half* off, int64_t stride, float* y, int64_t M,
                    int64_t N, int64_t n0) {
  int64_t m = 0;
  for (; m + MB <= M; m += MB) i4_block<NB, MB>(a, w, stride, y, n0, m, N);
  for (; m < M; ++m) i4_block<NB, 1>(a, w, stride, y, n0, m, N);
  for (int64_t n = n0; n < n0 + NB; ++n)
    for (m = 0; m < M; ++m) y[m * N + n] += i4_offsets(off + n * a.B, a.bsum.data() + m * a.B, a.B);
}

template <int NB, int MB>
inline void i4_out_blocks(const I4Rows& a, const uint8_t* w, const c10::Half* off, float* y, int64_t M, int64_t N) {
  const int64_t stride = i4_row_bytes(a.K), blocks = (N + NB - 1) / NB;
  at::parallel_for(0, blocks, 64 / NB, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * NB;
      if (n0 + NB <= N) {
        i4_rows<NB, MB>(a, w, off, stride, y, M, N, n0);
      } else {
        for (int64_t n = n0; n < N; ++n) i4_rows<1, MB>(a, w, off, stride, y, M, N, n);
      }
    }
  });
}

}  // namespace interlock_cpu

#include "int4_rows.h"      // two or more rows on VNNI: the same arithmetic from widened int16 factors

namespace interlock_cpu {

// y[M, N] = x[M, K] . W^T for records w ([N, i4_row_bytes(K)]) and offsets off ([N, K / 32] fp16).
inline void int4_linear_raw(const float* x, const uint8_t* w, const c10::Half* off, float* y, int64_t M, int64_t K,
                            int64_t N) {
  thread_local I4Rows scratch;
  i4_quantize(x, M, K, scratch);
#if defined(INTERLOCK_VNNI)
  if (M >= 2) {                          // int4_rows.h: the same bits, the factors widened once
    i4_linear_rows(scratch, w, off, y, M, N);
    return;
  }
#endif
  // A row alone (decode) takes 4 outputs at a time; elsewhere several rows take 2 outputs x up to 4
  // rows, so each activation chunk loaded feeds 2 dots and each unpacked weight chunk up to 4. The
  // grouping moves no bits.
  switch (M) {
    case 1: i4_out_blocks<4, 1>(scratch, w, off, y, M, N); break;
    case 2: i4_out_blocks<2, 2>(scratch, w, off, y, M, N); break;
    case 3: i4_out_blocks<2, 3>(scratch, w, off, y, M, N); break;
    default: i4_out_blocks<2, 4>(scratch, w, off, y, M, N); break;
  }
}

}  // namespace interlock_cpu
