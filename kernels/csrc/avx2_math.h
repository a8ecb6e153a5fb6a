#pragma once
// 8-lane fp32 helpers for CPUs with AVX2, FMA and F16C but not AVX-512 (Zen 1-3, Intel client
// parts): what attention.h and elementwise.h use there in place of their 16-lane AVX-512 code
// (the 8-lane exp is elementwise.h's exp_nonpositive8, beside the 16-lane one).
// Each is a fixed sequence of operations per row, so what they compute stays batch invariant.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

#include "simd.h"

#if defined(INTERLOCK_AVX2_MATH)

namespace interlock_cpu {

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) {       // bf16 is the top half of an fp32
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}
inline __m256 load8(const c10::Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// Lane i = the sum of v[i]'s 8 lanes, ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)) for each
// vector alone (hadd pairs lanes of one vector; the permutes only route).
inline __m256 sum8(const __m256 (&v)[8]) {
  const __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);    // [v0..v3 low | v0..v3 high], v4..v7
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// The sum of one vector's lanes in sum8's order.
inline float sum_lanes8(__m256 v) {
  const __m256 t = _mm256_hadd_ps(v, v), u = _mm256_hadd_ps(t, t);
  return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1)));
}

// Lanes < n of an 8-lane tail as all-ones masks, for maskload / maskstore.
inline __m256i tail_mask8(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

}  // namespace interlock_cpu

#endif
