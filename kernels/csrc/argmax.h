// Greedy verification's one read of the logits: per row, the largest logit the grammar allows.
//
// The general verify path masks the [rows, V] logits in place, rounds the padded ids to -inf,
// takes the argmax and checks each used row for NaN / nothing allowed: five passes over 200 KB a
// row and a dozen torch ops per step. Greedy rows need only the allowed argmax and the value at
// it, which one pass computes straight from the packed bitmask.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "simd.h"

namespace interlock_cpu {

// The rules, over values seen in increasing id order: the lowest id holding the largest value, and
// that value; NaN if a value seen is NaN, -inf if none is above -inf (the id is 0 in both cases).
struct ArgmaxRule {
  float best = -std::numeric_limits<float>::infinity();
  int64_t best_id = 0;
  bool nan = false;

  void see(int64_t id, float v) {
    if (std::isnan(v)) {
      nan = true;
    } else if (v > best) {
      best = v;
      best_id = id;
    }
  }

  void finish(int64_t* id_out, float* peak_out) const {
    const bool none = nan || !(best > -std::numeric_limits<float>::infinity());
    *id_out = none ? 0 : best_id;
    *peak_out = nan ? std::numeric_limits<float>::quiet_NaN() : best;
  }
};

// ArgmaxRule over ids [0, vocab) of `row` allowed by `words` (bit i of words[i / 32]; nullptr: all).
inline void masked_argmax_row(const float* row, const int32_t* words, int64_t vocab, int64_t* id_out,
                              float* peak_out) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  ArgmaxRule rule;
  int64_t i = 0;
#if defined(INTERLOCK_AVX512)
  __m512 vbest = _mm512_set1_ps(kNegInf);
  __m512i vid = _mm512_setzero_si512();
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __mmask16 any_nan = 0;
  for (; i + 16 <= vocab; i += 16) {
    const __m512 v = _mm512_loadu_ps(row + i);
    const __mmask16 allow =
        words == nullptr ? __mmask16(0xffff) : __mmask16(static_cast<uint32_t>(words[i >> 5]) >> (i & 31));
    any_nan |= _mm512_mask_cmp_ps_mask(allow, v, v, _CMP_UNORD_Q);
    const __mmask16 better = _mm512_mask_cmp_ps_mask(allow, v, vbest, _CMP_GT_OQ);   // strict: first wins
    vbest = _mm512_mask_mov_ps(vbest, better, v);
    vid = _mm512_mask_mov_epi32(vid, better, _mm512_add_epi32(iota, _mm512_set1_epi32(static_cast<int32_t>(i))));
  }
  rule.nan = any_nan != 0;
  rule.best = _mm512_reduce_max_ps(vbest);
  if (rule.best > kNegInf) {     // the lowest id among the lanes that hold the maximum
    const __mmask16 at = _mm512_cmp_ps_mask(vbest, _mm512_set1_ps(rule.best), _CMP_EQ_OQ);
    rule.best_id = _mm512_mask_reduce_min_epi32(at, vid);
  }
#endif
  for (; i < vocab; ++i) {
    if (words != nullptr && !((static_cast<uint32_t>(words[i >> 5]) >> (i & 31)) & 1u)) continue;
    rule.see(i, row[i]);
  }
  rule.finish(id_out, peak_out);
}

}  // namespace interlock_cpu
