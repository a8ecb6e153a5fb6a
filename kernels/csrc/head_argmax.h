#pragma once
// Greedy verification's head, told by the grammar which logits it needs.
//
// A greedy constrained row needs only the largest allowed logit (argmax.h). Where the grammar's
// mask allows few ids -- JSON structure, an enum, the row after a forced token; 60% of the verify
// rows of 12 JME requests allowed <= 256 ids, the other 40% > 40,000 -- those few dot products are
// all the row needs, not the 49,152 x 576 head (28 MB, a fifth of the weights a decode step reads).
// Rows with many allowed ids, or no mask, take the dense head together.
//
// Each logit computed is the same (row, output) arithmetic as int8_linear_raw's (tree_sums on the
// row quantized alone: a row's quantization depends on that row only, and every int8 kernel,
// AMX's tiles included, computes int8_linear.h's arithmetic), and the argmax reads the allowed ids
// in increasing order with argmax.h's rules, so ids and peaks are bitwise those of masked_argmax
// over the dense head.
#include <ATen/Parallel.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "argmax.h"
#include "int8_linear.h"

namespace interlock_cpu {

// Allowed ids of one packed mask row below vocab, in increasing order.
inline void allowed_ids(const int32_t* words, int64_t vocab, std::vector<int64_t>& out) {
  out.clear();
  for (int64_t w = 0; w * 32 < vocab; ++w) {
    uint32_t bits = static_cast<uint32_t>(words[w]);
    while (bits) {
      const int64_t id = w * 32 + __builtin_ctz(bits);
      if (id >= vocab) return;
      out.push_back(id);
      bits &= bits - 1;
    }
  }
}

inline int64_t allowed_count(const int32_t* words, int64_t vocab) {
  int64_t n = 0;
  for (int64_t w = 0; w * 32 < vocab; ++w) {
    uint32_t bits = static_cast<uint32_t>(words[w]);
    if ((w + 1) * 32 > vocab) bits &= (1u << (vocab - w * 32)) - 1u;
    n += __builtin_popcount(bits);
  }
  return n;
}

// x [R, E]; q [V, E] int8, scale [V]; words(r): row r's packed mask or nullptr; skip(r): nobody
// reads row r (id 0, peak -inf, nothing computed); ids/peaks [R].
template <class Words, class Skip>
inline void head_argmax_raw(const float* x, const int8_t* q, const float* scale, int64_t R, int64_t E, int64_t V,
                            Words&& words, Skip&& skip, int64_t vocab, int64_t max_sparse, int64_t* ids,
                            float* peaks) {
  std::vector<int64_t> dense, sparse;
  for (int64_t r = 0; r < R; ++r) {
    if (skip(r)) {
      ids[r] = 0;
      peaks[r] = -std::numeric_limits<float>::infinity();
      continue;
    }
    const int32_t* w = words(r);
    (w != nullptr && allowed_count(w, vocab) <= max_sparse ? sparse : dense).push_back(r);
  }
  if (!dense.empty()) {
    std::vector<float> xd(dense.size() * E), yd(dense.size() * V);
    for (size_t i = 0; i < dense.size(); ++i) std::copy(x + dense[i] * E, x + (dense[i] + 1) * E, xd.data() + i * E);
    int8_linear_raw(xd.data(), q, scale, yd.data(), static_cast<int64_t>(dense.size()), E, V);
    for (size_t i = 0; i < dense.size(); ++i)
      masked_argmax_row(yd.data() + i * V, words(dense[i]), vocab, ids + dense[i], peaks + dense[i]);
  }
  std::vector<int64_t> allowed;
  std::vector<const int8_t*> rows;
  std::vector<float> logit;
  for (const int64_t r : sparse) {
    QuantRows a;
#if defined(INTERLOCK_VNNI)
    quantize_rows(x + r * E, 1, E, a, /*with_fix=*/true);
#else
    quantize_rows(x + r * E, 1, E, a, /*with_fix=*/false);
#endif
    allowed_ids(words(r), vocab, allowed);
    const int64_t n = static_cast<int64_t>(allowed.size());
    rows.resize(n);
    logit.resize(n);
    for (int64_t i = 0; i < n; ++i) rows[i] = q + allowed[i] * E;
    at::parallel_for(0, n, 256, [&](int64_t i0, int64_t i1) {
      tree_sums(a, rows.data() + i0, i1 - i0, E, logit.data() + i0);
      for (int64_t i = i0; i < i1; ++i) logit[i] *= scale[allowed[i]];
    });
    ArgmaxRule rule;                 // argmax.h's rules, the allowed ids in increasing order
    for (int64_t i = 0; i < n; ++i) rule.see(allowed[i], logit[i]);
    rule.finish(ids + r, peaks + r);
  }
}

}  // namespace interlock_cpu
