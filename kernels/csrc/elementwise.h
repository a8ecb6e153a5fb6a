#pragma once
// The elementwise parts of a layer for the CPU forward (fp32): RMSNorm (one row at a time, sum of
// squares in a fixed 16-lane order), SiLU * up, tanh-GELU * up (Gemma 3's GeGLU) and RoPE, each a
// fixed sequence of operations on one row's data.
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>

#include "avx2_math.h"

#include "simd.h"

namespace interlock_cpu {

// exp for x <= 0 (softmax inputs after subtracting the max): 2^n * p(r), r = x - n ln2 (ln2 in two
// parts), |r| <= ln2/2, p the degree-6 Taylor polynomial; within ~4 ulp of exp. One set of constants
// for the 16-lane (AVX-512) and the 8-lane (AVX2) version.
namespace exp_poly {
constexpr float kMin = -87.0f;           // keeps n >= -126, so 2^n is a normal float
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693145751953125f, kLn2Lo = 1.428606765330187e-06f;
constexpr float kCoeffs[] = {1.f / 720, 1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f};   // highest power first
}  // namespace exp_poly

#if defined(INTERLOCK_AVX512)
inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(exp_poly::kMin));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(exp_poly::kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(exp_poly::kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(exp_poly::kLn2Lo), r);
  __m512 p = _mm512_set1_ps(exp_poly::kCoeffs[0]);
  for (int i = 1; i < 7; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(exp_poly::kCoeffs[i]));
  return _mm512_scalef_ps(p, n);
}
#elif defined(INTERLOCK_AVX2_MATH)
// 2^n built in the exponent bits (AVX2 has no scalef).
inline __m256 exp_nonpositive8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(exp_poly::kMin));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(exp_poly::kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(exp_poly::kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(exp_poly::kLn2Lo), r);
  __m256 p = _mm256_set1_ps(exp_poly::kCoeffs[0]);
  for (int i = 1; i < 7; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(exp_poly::kCoeffs[i]));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}
#endif

// y = weight * x / sqrt(mean(x^2) + eps) for one row of E values; y may be x.
inline void rms_norm_row(const float* row, const float* w, int64_t E, float eps, float* y) {
  float sq = 0.f;
  int64_t e = 0;
#if defined(INTERLOCK_AVX512)
  __m512 acc = _mm512_setzero_ps();
  for (; e + 16 <= E; e += 16) {
    const __m512 v = _mm512_loadu_ps(row + e);
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  sq = _mm512_reduce_add_ps(acc);
#elif defined(INTERLOCK_AVX2_MATH)
  __m256 acc = _mm256_setzero_ps();
  for (; e + 8 <= E; e += 8) {
    const __m256 v = _mm256_loadu_ps(row + e);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  sq = sum_lanes8(acc);
#endif
  for (; e < E; ++e) sq += row[e] * row[e];
  const float rstd = 1.f / std::sqrt(sq / static_cast<float>(E) + eps);
  for (int64_t i = 0; i < E; ++i) y[i] = w[i] * (row[i] * rstd);
}

// y[r] = weight * x[r] / sqrt(mean(x[r]^2) + eps), each row on its own; y may be x.
inline void rms_norm_raw(const float* x, const float* w, int64_t T, int64_t E, float eps, float* y) {
  at::parallel_for(0, T, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) rms_norm_row(x + r * E, w, E, eps, y + r * E);
  });
}

// out[i] = silu(gate[i]) * up[i] for n values; sigmoid from exp of a non-positive number only.
// Without AVX-512 the activations keep libm's exp and tanh: an 8-lane version on
// exp_nonpositive8 (within ~4 ulp) tipped the embedded model's greedy demo answer on a Zen 3 (role
// and start_year wrong, tests/test_cli.py). That 135M model sits on a knife's edge there; the
// arithmetic closest to the exact activation is the one to keep.
inline void silu_mul_raw(const float* gate, const float* up, int64_t n, float* out) {
  int64_t i = 0;
#if defined(INTERLOCK_AVX512)
  const __m512 one = _mm512_set1_ps(1.f);
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(g)));   // exp(-|g|)
    const __m512 denom = _mm512_add_ps(one, e);
    const __mmask16 neg = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
    const __m512 sig = _mm512_div_ps(_mm512_mask_blend_ps(neg, one, e), denom);
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_mul_ps(g, sig), _mm512_loadu_ps(up + i)));
  }
#endif
  for (; i < n; ++i) out[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
}

// out[i] = gelu_tanh(gate[i]) * up[i] for n values (Gemma 3's GeGLU):
// gelu_tanh(g) = g / 2 * (1 + tanh(sqrt(2 / pi) * (g + 0.044715 g^3))), with tanh(z) = sign(z) (1 - e) / (1 + e),
// e = exp(-2 |z|): exp of a non-positive number only, as in silu_mul_raw.
inline void gelu_tanh_mul_raw(const float* gate, const float* up, int64_t n, float* out) {
  constexpr float kC = 0.7978845608028654f, kA = 0.044715f;
  int64_t i = 0;
#if defined(INTERLOCK_AVX512)
  const __m512 one = _mm512_set1_ps(1.f), half = _mm512_set1_ps(0.5f);
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 z = _mm512_mul_ps(_mm512_set1_ps(kC), _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(kA), g),
                                                                       _mm512_mul_ps(g, g), g));
    const __m512 e = exp_nonpositive(_mm512_mul_ps(_mm512_set1_ps(-2.f), _mm512_abs_ps(z)));
    __m512 t = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));               // tanh(|z|)
    t = _mm512_mask_sub_ps(t, _mm512_cmp_ps_mask(z, _mm512_setzero_ps(), _CMP_LT_OQ), _mm512_setzero_ps(), t);
    const __m512 act = _mm512_mul_ps(_mm512_mul_ps(half, g), _mm512_add_ps(one, t));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(act, _mm512_loadu_ps(up + i)));
  }
#endif
  for (; i < n; ++i) {
    const float g = gate[i];
    out[i] = 0.5f * g * (1.f + std::tanh(kC * (g + kA * g * g * g))) * up[i];
  }
}

// Rotate-half RoPE in place on `heads` vectors of length D at one position, on their first R dims
// (R = D, or fewer for partial rotary; the rest pass); cos/sin: [R].
inline void rope_raw(float* x, int64_t heads, int64_t D, int64_t R, const float* cos, const float* sin) {
  const int64_t half = R / 2;
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * D;
    for (int64_t i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * cos[i] - b * sin[i];
      v[i + half] = b * cos[i + half] + a * sin[i + half];
    }
  }
}

}  // namespace interlock_cpu
