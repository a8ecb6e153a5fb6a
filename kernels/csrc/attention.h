#pragma once
// Row-path attention and RMSNorm for the CPU forward (fp32 activations).
//
// row_attention: each new token of one sequence (a decode row or a verify row) attends over
// exactly its own context -- positions 0 .. start + r -- read in place from the paged KV cache
// through the block table. One task per (row, KV head), each a fixed sequence of fp32 operations
// that depends only on that row's data: bitwise the same whether the row is alone or one of K+1.
// It replaces ~12 small torch ops per row and layer (slices, transposes, matmuls, softmax, stack).
//
// rms_norm: one row at a time, sum of squares in a fixed 16-lane order.
#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace interlock_cpu {

// Dot product of two fp32 vectors of length D (a multiple of 16), fixed order.
inline float dot(const float* a, const float* b, int64_t D) {
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; d += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), _mm512_loadu_ps(b + d), acc);
  return _mm512_reduce_add_ps(acc);
#else
  float acc = 0.f;
  for (int64_t d = 0; d < D; ++d) acc += a[d] * b[d];
  return acc;
#endif
}

// out[0:D] += p * v[0:D]
inline void axpy(float p, const float* v, float* out, int64_t D) {
#if defined(__AVX512F__)
  const __m512 pv = _mm512_set1_ps(p);
  for (int64_t d = 0; d < D; d += 16)
    _mm512_storeu_ps(out + d, _mm512_fmadd_ps(pv, _mm512_loadu_ps(v + d), _mm512_loadu_ps(out + d)));
#else
  for (int64_t d = 0; d < D; ++d) out[d] += p * v[d];
#endif
}

#if defined(__AVX512F__)
// exp for x <= 0 (softmax inputs after subtracting the max): 2^n * p(r), r = x - n ln2, |r| <= ln2/2.
inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1.f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}
#endif

// s[0:L] <- softmax(s[0:L]) in place; 16 lanes at a time, the tail through a masked load.
inline void softmax_(float* s, int64_t L) {
#if defined(__AVX512F__)
  __m512 peak = _mm512_set1_ps(-INFINITY);
  for (int64_t l = 0; l < L; l += 16) {
    const __mmask16 k = l + 16 <= L ? 0xFFFF : static_cast<__mmask16>((1u << (L - l)) - 1);
    peak = _mm512_max_ps(peak, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), k, s + l));
  }
  const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(peak));
  __m512 total = _mm512_setzero_ps();
  for (int64_t l = 0; l < L; l += 16) {
    const __mmask16 k = l + 16 <= L ? 0xFFFF : static_cast<__mmask16>((1u << (L - l)) - 1);
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + l), top));
    total = _mm512_add_ps(total, _mm512_maskz_mov_ps(k, e));
    _mm512_mask_storeu_ps(s + l, k, e);
  }
  const __m512 inv = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(total));
  for (int64_t l = 0; l < L; l += 16) {
    const __mmask16 k = l + 16 <= L ? 0xFFFF : static_cast<__mmask16>((1u << (L - l)) - 1);
    _mm512_mask_storeu_ps(s + l, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, s + l), inv));
  }
#else
  float peak = s[0];
  for (int64_t l = 1; l < L; ++l) peak = std::max(peak, s[l]);
  float total = 0.f;
  for (int64_t l = 0; l < L; ++l) total += (s[l] = std::exp(s[l] - peak));
  const float inv = 1.f / total;
  for (int64_t l = 0; l < L; ++l) s[l] *= inv;
#endif
}

// out[0:D] = sum_l p[l] * V[slot(l), h, :], accumulated in registers (D <= 128), keys in order.
inline void weighted_sum(const float* p, const float* vp, const int64_t* table, int64_t block_size,
                         int64_t L, int64_t Hkv, int64_t h, int64_t D, float* out) {
#if defined(__AVX512F__)
  if (D <= 128) {
    __m512 acc[8];
    const int64_t nv = D / 16;
    for (int64_t j = 0; j < nv; ++j) acc[j] = _mm512_setzero_ps();
    for (int64_t l = 0; l < L; ++l) {
      const float* value = vp + ((table[l / block_size] * block_size + l % block_size) * Hkv + h) * D;
      const __m512 pl = _mm512_set1_ps(p[l]);
      for (int64_t j = 0; j < nv; ++j) acc[j] = _mm512_fmadd_ps(pl, _mm512_loadu_ps(value + 16 * j), acc[j]);
    }
    for (int64_t j = 0; j < nv; ++j) _mm512_storeu_ps(out + 16 * j, acc[j]);
    return;
  }
#endif
  for (int64_t d = 0; d < D; ++d) out[d] = 0.f;
  for (int64_t l = 0; l < L; ++l)
    axpy(p[l], vp + ((table[l / block_size] * block_size + l % block_size) * Hkv + h) * D, out, D);
}

// One (row, KV head) of row attention: the row at position `pos` attends over positions 0 .. pos
// of its sequence (through `table`); its G query heads at q (heads contiguous, D each), output at
// out. Rows of a verify step each re-read the context: measured, sharing the loads across a
// sequence's rows (one task per KV head) was slower on 2 cores than this finer split (3 tasks
// on 2 threads leave one idle a third of the time; the re-reads hit L2).
inline void row_attention_task(const float* q, int64_t H, int64_t D, const float* kp, const float* vp,
                               int64_t Hkv, int64_t h, const int64_t* table, int64_t block_size, int64_t pos,
                               float scale, float* out, std::vector<float>& scores) {
  const int64_t G = H / Hkv, L = pos + 1;
  scores.resize(G * L);
  for (int64_t l = 0; l < L; ++l) {
    const float* key = kp + ((table[l / block_size] * block_size + l % block_size) * Hkv + h) * D;
    for (int64_t g = 0; g < G; ++g) scores[g * L + l] = dot(q + (h * G + g) * D, key, D) * scale;
  }
  for (int64_t g = 0; g < G; ++g) softmax_(scores.data() + g * L, L);
  for (int64_t g = 0; g < G; ++g)
    weighted_sum(scores.data() + g * L, vp, table, block_size, L, Hkv, h, D, out + (h * G + g) * D);
}

// y[r] = weight * x[r] / sqrt(mean(x[r]^2) + eps), each row on its own.
inline void rms_norm_raw(const float* x, const float* w, int64_t T, int64_t E, float eps, float* y) {
  at::parallel_for(0, T, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = x + r * E;
      float sq = 0.f;
      int64_t e = 0;
#if defined(__AVX512F__)
      __m512 acc = _mm512_setzero_ps();
      for (; e + 16 <= E; e += 16) {
        const __m512 v = _mm512_loadu_ps(row + e);
        acc = _mm512_fmadd_ps(v, v, acc);
      }
      sq = _mm512_reduce_add_ps(acc);
#endif
      for (; e < E; ++e) sq += row[e] * row[e];
      const float rstd = 1.f / std::sqrt(sq / static_cast<float>(E) + eps);
      for (int64_t i = 0; i < E; ++i) y[r * E + i] = w[i] * (row[i] * rstd);
    }
  });
}

// out[i] = silu(gate[i]) * up[i] for n values; sigmoid from exp of a non-positive number only.
inline void silu_mul_raw(const float* gate, const float* up, int64_t n, float* out) {
  int64_t i = 0;
#if defined(__AVX512F__)
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

// Rotate-half RoPE in place on `heads` vectors of length D at one position (cos/sin: [D]).
inline void rope_raw(float* x, int64_t heads, int64_t D, const float* cos, const float* sin) {
  const int64_t half = D / 2;
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
