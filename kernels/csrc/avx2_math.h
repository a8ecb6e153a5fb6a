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

// The sum of one vector's lanes, ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)).
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
