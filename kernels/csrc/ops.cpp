// torch.ops.interlock_cpu: argument checks around the kernels in int8_linear.h, int4_linear.h and attention.h,
// and rows_forward, the whole decoder stack for decode / verify rows in one call.
//
// Why rows_forward: a decode step of a 30-layer model is ~900 small torch ops, and at batch 1
// their dispatch (~3-5 us each) cost as much as reading the weights. One call runs every layer
// on the same kernels, so a row's arithmetic is still a fixed function of that row's data.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <string>
#include <vector>

#include "argmax.h"
#include "attention.h"
#include "head_argmax.h"
#include "int4_linear.h"
#include "int8_linear.h"

namespace interlock_cpu {
namespace {

void check_f32(const at::Tensor& t, int64_t dim, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.dim() == dim && t.is_contiguous(),
              name, ": a contiguous fp32 CPU tensor with ", dim, " dims");
}

void check_cache(const at::Tensor& t, int64_t dim, const char* name) {
  const auto type = t.scalar_type();
  TORCH_CHECK(t.device().is_cpu() && (type == at::kFloat || type == at::kHalf || type == at::kBFloat16) &&
              t.dim() == dim && t.is_contiguous(), name, ": a contiguous fp32, fp16 or bf16 CPU tensor with ", dim, " dims");
}

// f(k, v) with the caches' data as float*, f16* or bf16* (check_cache has allowed only those three).
template <class F>
void with_cache_type(const at::Tensor& k, const at::Tensor& v, F&& f) {
  if (k.scalar_type() == at::kFloat)
    f(k.data_ptr<float>(), v.data_ptr<float>());
  else if (k.scalar_type() == at::kHalf)
    f(reinterpret_cast<f16*>(k.data_ptr<at::Half>()), reinterpret_cast<f16*>(v.data_ptr<at::Half>()));
  else
    f(reinterpret_cast<bf16*>(k.data_ptr<at::BFloat16>()), reinterpret_cast<bf16*>(v.data_ptr<at::BFloat16>()));
}

void check_int8(const at::Tensor& q, const at::Tensor& scale, int64_t K, const char* name) {
  TORCH_CHECK(q.device().is_cpu() && q.scalar_type() == at::kChar && q.dim() == 2 && q.is_contiguous() &&
              q.size(1) == K && K % kQBlock == 0, name, ": contiguous int8 [N, ", K, "], K a multiple of 32");
  check_f32(scale, 1, name);
  TORCH_CHECK(scale.size(0) == q.size(0), name, ": one scale per output row");
}

void check_int4(const at::Tensor& w, const at::Tensor& off, int64_t K, const char* name) {
  TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kByte && w.dim() == 2 && w.is_contiguous() &&
              K % kI4Chunk == 0 && w.size(1) == i4_row_bytes(K), name,
              ": contiguous uint8 int4 records [N, ", i4_row_bytes(K), "], K (", K, ") a multiple of 64");
  TORCH_CHECK(off.device().is_cpu() && off.scalar_type() == at::kHalf && off.dim() == 2 && off.is_contiguous() &&
              off.size(0) == w.size(0) && off.size(1) == K / kI4Block, name, ": contiguous fp16 offsets [N, K / 32]");
}

// A projection's weight: int8 rows with one scale each (q int8 [N, K], s fp32 [N]), or int4 (q the
// uint8 records, s the fp16 block offsets: int4_linear.h). Both give [M, N] from the same quantized
// activations.
void check_weight(const at::Tensor& q, const at::Tensor& s, int64_t K, const char* name) {
  if (q.scalar_type() == at::kByte) {
    check_int4(q, s, K, name);
  } else {
    check_int8(q, s, K, name);
  }
}

inline void project(const at::Tensor& q, const at::Tensor& s, const float* x, float* y, int64_t M, int64_t K,
                    int64_t N) {
  if (q.scalar_type() == at::kByte) {
    int4_linear_raw(x, q.data_ptr<uint8_t>(), s.data_ptr<at::Half>(), y, M, K, N);
  } else {
    int8_linear_raw(x, q.data_ptr<int8_t>(), s.data_ptr<float>(), y, M, K, N);
  }
}

void check_table(const at::Tensor& blocks, int64_t positions, int64_t block_size, int64_t slots) {
  TORCH_CHECK(blocks.scalar_type() == at::kLong && blocks.dim() == 1 && blocks.is_contiguous(), "blocks: long [nb]");
  const int64_t need = (positions + block_size - 1) / block_size;
  TORCH_CHECK(need <= blocks.size(0), "block table too short: ", blocks.size(0), " blocks for ", positions, " positions");
  const int64_t* table = blocks.data_ptr<int64_t>();
  for (int64_t b = 0; b < need; ++b)
    TORCH_CHECK(table[b] >= 0 && (table[b] + 1) * block_size <= slots, "block id ", table[b], " out of range");
}

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale) {
  check_f32(x, 2, "x");
  check_int8(q, scale, x.size(1), "q");
  at::Tensor y = at::empty({x.size(0), q.size(0)}, x.options());
  int8_linear_raw(x.data_ptr<float>(), q.data_ptr<int8_t>(), scale.data_ptr<float>(), y.data_ptr<float>(),
                  x.size(0), x.size(1), q.size(0));
  return y;
}

at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& off) {
  check_f32(x, 2, "x");
  check_int4(w, off, x.size(1), "w");
  at::Tensor y = at::empty({x.size(0), w.size(0)}, x.options());
  int4_linear_raw(x.data_ptr<float>(), w.data_ptr<uint8_t>(), off.data_ptr<at::Half>(), y.data_ptr<float>(),
                  x.size(0), x.size(1), w.size(0));
  return y;
}

// Which int8 x int8 kernel this process runs: "amx", "vnni", "avx2" or "portable" (kernels/native.py).
std::string int8_kernel() {
#if defined(INTERLOCK_VNNI)
  return amx_enabled() ? "amx" : "vnni";
#elif defined(INTERLOCK_AVX2)
  return "avx2";
#else
  return "portable";
#endif
}

// Which int4 kernel: "vnni", "avx2" or "portable" (AMX machines run the VNNI one: all have VNNI).
std::string int4_kernel() {
#if defined(INTERLOCK_VNNI)
  return "vnni";
#elif defined(INTERLOCK_AVX2)
  return "avx2";
#else
  return "portable";
#endif
}

at::Tensor row_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                         const at::Tensor& blocks, int64_t block_size, int64_t start, double scale, int64_t window) {
  check_f32(q, 3, "q");
  check_cache(k_cache, 3, "k_cache");
  check_cache(v_cache, 3, "v_cache");
  const int64_t n = q.size(0), H = q.size(1), D = q.size(2), Hkv = k_cache.size(1);
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes() && k_cache.scalar_type() == v_cache.scalar_type() &&
              k_cache.size(2) == D && H % Hkv == 0 && D % 16 == 0, "head shapes do not match");
  check_table(blocks, start + n, block_size, k_cache.size(0));
  TORCH_CHECK(window >= 0, "window: >= 0 (0: none)");
  at::Tensor out = at::empty({n, H * D}, q.options());
  const std::vector<SeqRows> seqs{SeqRows{q.data_ptr<float>(), H * D, n, start, blocks.data_ptr<int64_t>(),
                                          out.data_ptr<float>(), H * D}};
  with_cache_type(k_cache, v_cache, [&](const auto* kp, const auto* vp) {
    attend_rows(seqs, H, D, kp, vp, Hkv, block_size, static_cast<float>(scale), window);
  });
  return out;
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_f32(x, 2, "x");
  check_f32(weight, 1, "weight");
  TORCH_CHECK(weight.size(0) == x.size(1), "weight: one value per column of x");
  at::Tensor y = at::empty_like(x);
  rms_norm_raw(x.data_ptr<float>(), weight.data_ptr<float>(), x.size(0), x.size(1), static_cast<float>(eps),
               y.data_ptr<float>());
  return y;
}

// logits [R, V] fp32; bitmask [M, W] int32 (packed, 32 ids a word); mask_rows [R]: the bitmask row
// of each logits row, -1 for none. Returns (ids [R] int64, peaks [R] fp32): argmax.h.
std::tuple<at::Tensor, at::Tensor> masked_argmax(const at::Tensor& logits, const at::Tensor& bitmask,
                                                 const at::Tensor& mask_rows, int64_t vocab) {
  check_f32(logits, 2, "logits");
  TORCH_CHECK(bitmask.device().is_cpu() && bitmask.scalar_type() == at::kInt && bitmask.dim() == 2 &&
              bitmask.is_contiguous(), "bitmask: contiguous int32 [M, W] on the CPU");
  TORCH_CHECK(mask_rows.device().is_cpu() && mask_rows.scalar_type() == at::kLong && mask_rows.dim() == 1 &&
              mask_rows.size(0) == logits.size(0) && mask_rows.is_contiguous(), "mask_rows: int64 [R]");
  TORCH_CHECK(vocab >= 1 && vocab <= logits.size(1) && bitmask.size(1) * 32 >= vocab, "vocab out of range");
  const int64_t R = logits.size(0), V = logits.size(1), W = bitmask.size(1), M = bitmask.size(0);
  at::Tensor ids = at::empty({R}, at::kLong), peaks = at::empty({R}, at::kFloat);
  const float* lp = logits.data_ptr<float>();
  const int32_t* bp = bitmask.data_ptr<int32_t>();
  const int64_t* mr = mask_rows.data_ptr<int64_t>();
  for (int64_t r = 0; r < R; ++r) {
    TORCH_CHECK(mr[r] < M, "mask_rows: row ", mr[r], " outside the bitmask's ", M);
    masked_argmax_row(lp + r * V, mr[r] < 0 ? nullptr : bp + mr[r] * W, vocab, ids.data_ptr<int64_t>() + r,
                      peaks.data_ptr<float>() + r);
  }
  return {ids, peaks};
}

// x [R, E] fp32 (the final-normed rows); q [V, E] int8 and scale [V]: the head; bitmask and
// mask_rows as masked_argmax's, plus -2 for a row nobody reads (skipped). masked_argmax(x @ head,
// ...) without the logits: rows allowing at most max_sparse ids compute only those (head_argmax.h).
// Returns (ids [R] int64, peaks [R] fp32).
std::tuple<at::Tensor, at::Tensor> head_argmax(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale,
                                               const at::Tensor& bitmask, const at::Tensor& mask_rows,
                                               int64_t vocab, int64_t max_sparse) {
  check_f32(x, 2, "x");
  check_int8(q, scale, x.size(1), "q");
  TORCH_CHECK(bitmask.device().is_cpu() && bitmask.scalar_type() == at::kInt && bitmask.dim() == 2 &&
              bitmask.is_contiguous(), "bitmask: contiguous int32 [M, W] on the CPU");
  TORCH_CHECK(mask_rows.device().is_cpu() && mask_rows.scalar_type() == at::kLong && mask_rows.dim() == 1 &&
              mask_rows.size(0) == x.size(0) && mask_rows.is_contiguous(), "mask_rows: int64 [R]");
  TORCH_CHECK(vocab >= 1 && vocab <= q.size(0) && bitmask.size(1) * 32 >= vocab, "vocab out of range");
  const int64_t R = x.size(0), W = bitmask.size(1), M = bitmask.size(0);
  const int32_t* bp = bitmask.data_ptr<int32_t>();
  const int64_t* mr = mask_rows.data_ptr<int64_t>();
  for (int64_t r = 0; r < R; ++r)
    TORCH_CHECK(mr[r] >= -2 && mr[r] < M, "mask_rows: row ", mr[r], " outside the bitmask's ", M);
  at::Tensor ids = at::empty({R}, at::kLong), peaks = at::empty({R}, at::kFloat);
  head_argmax_raw(x.data_ptr<float>(), q.data_ptr<int8_t>(), scale.data_ptr<float>(), R, x.size(1), q.size(0),
                  [&](int64_t r) { return mr[r] < 0 ? nullptr : bp + mr[r] * W; },
                  [&](int64_t r) { return mr[r] == -2; }, vocab, max_sparse,
                  ids.data_ptr<int64_t>(), peaks.data_ptr<float>());
  return {ids, peaks};
}

// The per-layer weights of rows_forward, one entry per layer in each list (qkv_b, q_norms, k_norms,
// post_attn_norms and post_ffn_norms empty where the family has none).
struct LayerWeights {
  at::TensorList attn_norms, ffn_norms, qkv_q, qkv_s, qkv_b, o_q, o_s, up_q, up_s, down_q, down_s;
  at::TensorList q_norms, k_norms, post_attn_norms, post_ffn_norms;
};

void check_layers(const LayerWeights& w, int64_t E, int64_t H, int64_t Hkv, int64_t D, int64_t QKV) {
  const size_t L = w.attn_norms.size();
  for (const at::TensorList* list : {&w.ffn_norms, &w.qkv_q, &w.qkv_s, &w.o_q, &w.o_s, &w.up_q, &w.up_s, &w.down_q,
                                     &w.down_s})
    TORCH_CHECK(list->size() == L, "one weight of each kind per layer");
  for (const at::TensorList* list : {&w.qkv_b, &w.q_norms, &w.k_norms, &w.post_attn_norms, &w.post_ffn_norms})
    TORCH_CHECK(list->empty() || list->size() == L, "optional weights: none, or one per layer");
  TORCH_CHECK(w.q_norms.size() == w.k_norms.size() && w.post_attn_norms.size() == w.post_ffn_norms.size(),
              "q/k norms, and the two post norms, come together");
  const int64_t I = L ? w.up_q[0].size(0) / 2 : 0;
  for (size_t l = 0; l < L; ++l) {
    check_f32(w.attn_norms[l], 1, "attn_norm");
    check_f32(w.ffn_norms[l], 1, "ffn_norm");
    TORCH_CHECK(w.attn_norms[l].size(0) == E && w.ffn_norms[l].size(0) == E, "norms: [E]");
    check_weight(w.qkv_q[l], w.qkv_s[l], E, "wqkv");
    check_weight(w.o_q[l], w.o_s[l], H * D, "wo");
    check_weight(w.up_q[l], w.up_s[l], E, "w13");
    check_weight(w.down_q[l], w.down_s[l], I, "w2");
    TORCH_CHECK(w.qkv_q[l].size(0) == QKV && w.o_q[l].size(0) == E && w.up_q[l].size(0) == 2 * I &&
                w.down_q[l].size(0) == E, "projection shapes do not match the config");
    if (!w.qkv_b.empty()) {
      check_f32(w.qkv_b[l], 1, "bqkv");
      TORCH_CHECK(w.qkv_b[l].size(0) == QKV, "bqkv: [QKV]");
    }
    if (!w.q_norms.empty()) {
      check_f32(w.q_norms[l], 1, "q_norm");
      check_f32(w.k_norms[l], 1, "k_norm");
      TORCH_CHECK(w.q_norms[l].size(0) == D && w.k_norms[l].size(0) == D, "q/k norms: [D]");
    }
    if (!w.post_attn_norms.empty()) {
      check_f32(w.post_attn_norms[l], 1, "post_attn_norm");
      check_f32(w.post_ffn_norms[l], 1, "post_ffn_norm");
      TORCH_CHECK(w.post_attn_norms[l].size(0) == E && w.post_ffn_norms[l].size(0) == E, "post norms: [E]");
    }
  }
}

// x: [T, E] embeddings of the row tokens (scaled); cos/sin: RoPE tables at their positions, [T, R]
// each, rope_index picking one per layer (a family with sliding layers of their own base has two);
// write_slots: [T] KV slot of each. The rows are grouped by sequence: seq_offsets/lengths/starts and
// one block table each. k_all/v_all: [layers, slots, Hkv, D], written at write_slots. Per-layer
// weights in lists (LayerWeights), windows[l]: layer l's sliding window (0: none); attn_scale: the
// softmax scale of q . k; activation: "silu" or "gelu_tanh". Returns the hidden states after the layers.
at::Tensor rows_forward(const at::Tensor& x_in, at::TensorList cos, at::TensorList sin, at::IntArrayRef rope_index,
                        const at::Tensor& write_slots, at::TensorList tables, at::IntArrayRef seq_offsets,
                        at::IntArrayRef seq_lengths, at::IntArrayRef seq_starts, at::Tensor& k_all, at::Tensor& v_all,
                        at::TensorList attn_norms, at::TensorList ffn_norms, at::TensorList qkv_q,
                        at::TensorList qkv_s, at::TensorList qkv_b, at::TensorList o_q, at::TensorList o_s,
                        at::TensorList up_q, at::TensorList up_s, at::TensorList down_q, at::TensorList down_s,
                        at::TensorList q_norms, at::TensorList k_norms, at::TensorList post_attn_norms,
                        at::TensorList post_ffn_norms, at::IntArrayRef windows, int64_t n_heads, int64_t n_kv_heads,
                        double eps, double attn_scale, c10::string_view activation, int64_t block_size) {
  check_f32(x_in, 2, "x");
  check_cache(k_all, 4, "k_all");
  check_cache(v_all, 4, "v_all");
  const LayerWeights w{attn_norms, ffn_norms, qkv_q, qkv_s, qkv_b, o_q, o_s, up_q, up_s, down_q, down_s,
                       q_norms, k_norms, post_attn_norms, post_ffn_norms};
  const int64_t T = x_in.size(0), E = x_in.size(1), layers = static_cast<int64_t>(attn_norms.size());
  const int64_t H = n_heads, Hkv = n_kv_heads, D = k_all.size(3), slots = k_all.size(1);
  const int64_t QKV = (H + 2 * Hkv) * D;
  TORCH_CHECK(!cos.empty() && cos.size() == sin.size(), "cos/sin: one or more tables, as many of each");
  const int64_t R = cos[0].size(1);
  for (size_t i = 0; i < cos.size(); ++i) {
    check_f32(cos[i], 2, "cos");
    check_f32(sin[i], 2, "sin");
    TORCH_CHECK(cos[i].size(0) == T && cos[i].size(1) == R && sin[i].sizes() == cos[i].sizes(), "cos/sin: [T, R]");
  }
  TORCH_CHECK(R % 2 == 0 && R <= D, "RoPE: an even number of rotary dims, at most D");
  TORCH_CHECK(static_cast<int64_t>(rope_index.size()) == layers && static_cast<int64_t>(windows.size()) == layers,
              "rope_index and windows: one per layer");
  for (int64_t l = 0; l < layers; ++l)
    TORCH_CHECK(rope_index[l] >= 0 && rope_index[l] < static_cast<int64_t>(cos.size()) && windows[l] >= 0,
                "rope_index names a table; windows >= 0");
  TORCH_CHECK(activation == "silu" || activation == "gelu_tanh", "activation: silu or gelu_tanh");
  const bool gelu = activation == "gelu_tanh";
  TORCH_CHECK(k_all.sizes() == v_all.sizes() && k_all.scalar_type() == v_all.scalar_type() &&
              k_all.size(2) == Hkv && k_all.size(0) >= layers &&
              H % Hkv == 0 && D % 16 == 0, "KV caches do not match the heads");
  TORCH_CHECK(write_slots.scalar_type() == at::kLong && write_slots.dim() == 1 && write_slots.size(0) == T &&
              write_slots.is_contiguous(), "write_slots: long [T]");
  const size_t S = tables.size();
  TORCH_CHECK(seq_offsets.size() == S && seq_lengths.size() == S && seq_starts.size() == S, "one entry per sequence");
  int64_t covered = 0;
  for (size_t s = 0; s < S; ++s) {
    TORCH_CHECK(seq_offsets[s] == covered && seq_lengths[s] > 0, "sequences must tile the rows in order");
    covered += seq_lengths[s];
    check_table(tables[s], seq_starts[s] + seq_lengths[s], block_size, slots);
  }
  TORCH_CHECK(covered == T, "sequences cover ", covered, " of ", T, " rows");
  const int64_t* ws = write_slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) TORCH_CHECK(ws[t] >= 0 && ws[t] < slots, "write slot out of range");
  check_layers(w, E, H, Hkv, D, QKV);
  const int64_t I = layers ? up_q[0].size(0) / 2 : 0;

  at::Tensor x = x_in.clone();
  float* xp = x.data_ptr<float>();
  // Scratch kept per thread between calls: a prompt chunk's buffers are megabytes, and fresh ones
  // cost a page fault per 4 KB on first touch. Every element is written before it is read.
  thread_local std::vector<float> scratch[6];
  auto buffer = [](std::vector<float>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(n);
    return v.data();
  };
  float *h = buffer(scratch[0], T * E), *qkv = buffer(scratch[1], T * QKV), *attn = buffer(scratch[2], T * H * D),
        *tmp = buffer(scratch[3], T * E), *gu = buffer(scratch[4], T * 2 * I), *act = buffer(scratch[5], T * I);
  // Per-row elementwise work, across the threads for a prompt chunk (a few rows run inline).
  auto each_row = [T](auto&& f) { at::parallel_for(0, T, 16, [&](int64_t t0, int64_t t1) { for (int64_t t = t0; t < t1; ++t) f(t); }); };
  auto add_tmp = [&](int64_t t) { for (int64_t i = t * E; i < (t + 1) * E; ++i) xp[i] += tmp[i]; };   // the residual
  const float epsf = static_cast<float>(eps), scale = static_cast<float>(attn_scale);
  const int64_t layer_slots = slots * Hkv * D;

  // The layer loop for any cache type (T = float, f16 or bf16; K/V rounded to T as they are written,
  // as torch's .to() does on the prompt path).
  auto run_layers = [&](auto* k_base, auto* v_base) {
  for (int64_t l = 0; l < layers; ++l) {
    auto* kc = k_base + l * layer_slots;
    auto* vc = v_base + l * layer_slots;
    const float *cp = cos[rope_index[l]].data_ptr<float>(), *sp = sin[rope_index[l]].data_ptr<float>();
    rms_norm_raw(xp, attn_norms[l].data_ptr<float>(), T, E, epsf, h);
    project(qkv_q[l], qkv_s[l], h, qkv, T, E, QKV);
    each_row([&](int64_t t) {
      float* row = qkv + t * QKV;
      if (!qkv_b.empty()) {
        const float* b = qkv_b[l].data_ptr<float>();
        for (int64_t i = 0; i < QKV; ++i) row[i] += b[i];
      }
      if (!q_norms.empty()) {                                      // per head, before RoPE (Qwen3, Gemma 3)
        for (int64_t i = 0; i < H; ++i) rms_norm_row(row + i * D, q_norms[l].data_ptr<float>(), D, epsf, row + i * D);
        for (int64_t i = H; i < H + Hkv; ++i)
          rms_norm_row(row + i * D, k_norms[l].data_ptr<float>(), D, epsf, row + i * D);
      }
      rope_raw(row, H + Hkv, D, R, cp + t * R, sp + t * R);       // q and k heads are adjacent
      std::copy(row + H * D, row + (H + Hkv) * D, kc + ws[t] * Hkv * D);
      std::copy(row + (H + Hkv) * D, row + QKV, vc + ws[t] * Hkv * D);
    });
    std::vector<SeqRows> seqs;
    for (size_t s = 0; s < S; ++s)
      seqs.push_back({qkv + seq_offsets[s] * QKV, QKV, seq_lengths[s], seq_starts[s],
                      tables[s].data_ptr<int64_t>(), attn + seq_offsets[s] * H * D, H * D});
    attend_rows(seqs, H, D, kc, vc, Hkv, block_size, scale, windows[l]);
    project(o_q[l], o_s[l], attn, tmp, T, H * D, E);
    if (!post_attn_norms.empty()) rms_norm_raw(tmp, post_attn_norms[l].data_ptr<float>(), T, E, epsf, tmp);
    each_row(add_tmp);
    rms_norm_raw(xp, ffn_norms[l].data_ptr<float>(), T, E, epsf, h);
    project(up_q[l], up_s[l], h, gu, T, E, 2 * I);
    each_row([&](int64_t t) {
      if (gelu) gelu_tanh_mul_raw(gu + t * 2 * I, gu + t * 2 * I + I, I, act + t * I);
      else silu_mul_raw(gu + t * 2 * I, gu + t * 2 * I + I, I, act + t * I);
    });
    project(down_q[l], down_s[l], act, tmp, T, I, E);
    if (!post_ffn_norms.empty()) rms_norm_raw(tmp, post_ffn_norms[l].data_ptr<float>(), T, E, epsf, tmp);
    each_row(add_tmp);
  }
  };
  with_cache_type(k_all, v_all, run_layers);
  return x;
}

}  // namespace
}  // namespace interlock_cpu

TORCH_LIBRARY(interlock_cpu, m) {
  m.def("int8_linear(Tensor x, Tensor q, Tensor scale) -> Tensor");
  m.def("int8_kernel() -> str", &interlock_cpu::int8_kernel);
  m.def("int4_linear(Tensor x, Tensor w, Tensor offsets) -> Tensor");
  m.def("int4_kernel() -> str", &interlock_cpu::int4_kernel);
  m.def("row_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor blocks, int block_size, int start, "
        "float scale, int window=0) -> Tensor");
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("masked_argmax(Tensor logits, Tensor bitmask, Tensor mask_rows, int vocab) -> (Tensor, Tensor)");
  m.def("head_argmax(Tensor x, Tensor q, Tensor scale, Tensor bitmask, Tensor mask_rows, int vocab, "
        "int max_sparse) -> (Tensor, Tensor)");
  m.def("rows_forward(Tensor x, Tensor[] cos, Tensor[] sin, int[] rope_index, Tensor write_slots, Tensor[] tables, "
        "int[] seq_offsets, int[] seq_lengths, int[] seq_starts, Tensor(a!) k_all, Tensor(b!) v_all, "
        "Tensor[] attn_norms, Tensor[] ffn_norms, Tensor[] qkv_q, Tensor[] qkv_s, Tensor[] qkv_b, Tensor[] o_q, "
        "Tensor[] o_s, Tensor[] up_q, Tensor[] up_s, Tensor[] down_q, Tensor[] down_s, Tensor[] q_norms, "
        "Tensor[] k_norms, Tensor[] post_attn_norms, Tensor[] post_ffn_norms, int[] windows, int n_heads, "
        "int n_kv_heads, float eps, float attn_scale, str activation, int block_size) -> Tensor");
}

TORCH_LIBRARY_IMPL(interlock_cpu, CPU, m) {
  m.impl("int8_linear", &interlock_cpu::int8_linear);
  m.impl("int4_linear", &interlock_cpu::int4_linear);
  m.impl("row_attention", &interlock_cpu::row_attention);
  m.impl("rms_norm", &interlock_cpu::rms_norm);
  m.impl("masked_argmax", &interlock_cpu::masked_argmax);
  m.impl("head_argmax", &interlock_cpu::head_argmax);
  m.impl("rows_forward", &interlock_cpu::rows_forward);
}
