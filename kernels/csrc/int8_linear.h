#pragma once
// y[M, N] = (x[M, K] . q[N, K]^T) * scale[N]: int8 weights with one scale per output row, and
// activations quantized on the fly to int8 in blocks of 32 along K with one fp32 scale per block
// (the Q8_0 activations of llama.cpp). The CPU decode and verify projections, and prompt chunks
// where AMX runs them (int8_amx.h).
//
// Why int8 activations: with fp32 activations every weight is converted to fp32 and fed to one
// FMA per activation row, which made 4 rows compute-bound (the GEMV over all weights took
// 1.2-1.45x the 1-row time). AVX512-VNNI multiplies 64 int8 pairs per instruction, so a 64-weight
// chunk costs, per row, one dot instruction plus a conversion and an FMA for the block scales,
// and extra rows stay under the weight-streaming time. Quality against the bf16 model, measured by
// benchmarks/kernel_quality.py, is in README ("Native CPU kernels").
//
// Signs: VNNI's dot takes unsigned x signed bytes. The weights are flipped to unsigned on the fly
// (w ^ 0x80 = w + 128) and the surplus 128 * sum(activations) is subtracted by starting each
// chunk's integer accumulator at -128 * (sum of each lane's four activations), kept per row.
//
// Batch invariance: for one (row m, output n) each 64-wide chunk's integer dot is exact and
// converts to fp32 exactly (|sum| < 2^24); the chunks are scaled and accumulated in K order in
// 16 fp32 lanes, reduced in a fixed tree and scaled by scale[n]. A row's quantization depends on
// that row alone. So the result is the same sequence of operations whatever M is and however rows
// and outputs are grouped or split across threads: a row alone equals the same row in a batch.
#include <ATen/Parallel.h>

#include "int8_amx.h"
#include "int8_avx2.h"
#include "int8_quant.h"

namespace interlock_cpu {

#if defined(INTERLOCK_VNNI)

// One 64-weight chunk of NB output rows against MB activation rows: the NB weight chunks are
// loaded once, in registers, and each activation row's chunk data streams past them. (Holding the
// MB rows' data instead spilled at MB = 4 and made a 4-row step compute-bound on Zen 4.)
template <int NB, int MB, bool Tail>
inline void step(const QuantRows& a, const int8_t* q, int64_t K, int64_t n0, int64_t m0, int64_t c,
                 __m512 (&acc)[NB][MB]) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i w[NB];
  for (int n = 0; n < NB; ++n) {
    const int8_t* at = q + (n0 + n) * K + c * kChunk;
    _mm_prefetch(reinterpret_cast<const char*>(at + kPrefetchL2), _MM_HINT_T1);
    // A last half chunk (K % 64 == 32) reads 32 bytes; its other lanes meet zero activations.
    w[n] = _mm512_xor_si512(flip, Tail ? _mm512_maskz_loadu_epi8(0xFFFFFFFFull, at) : _mm512_loadu_si512(at));
  }
  for (int m = 0; m < MB; ++m) {
    const __m512i xq = _mm512_loadu_si512(a.qs(m0 + m, c)), fix = _mm512_loadu_si512(a.fix(m0 + m, c));
    const __m512 sc = _mm512_loadu_ps(a.scales(m0 + m, c));
    for (int n = 0; n < NB; ++n)
      acc[n][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(fix, w[n], xq)), sc, acc[n][m]);
  }
}

// NB output rows x MB activation rows: NB * MB independent accumulators.
template <int NB, int MB>
inline void block_vnni(const QuantRows& a, const int8_t* q, const float* scale, float* y,
                       int64_t K, int64_t N, int64_t n0, int64_t m0) {
  __m512 acc[NB][MB];
  for (int n = 0; n < NB; ++n)
    for (int m = 0; m < MB; ++m) acc[n][m] = _mm512_setzero_ps();
  const int64_t full = K / kChunk;
  for (int64_t c = 0; c < full; ++c) step<NB, MB, false>(a, q, K, n0, m0, c, acc);
  if (full < a.chunks) step<NB, MB, true>(a, q, K, n0, m0, full, acc);
  for (int n = 0; n < NB; ++n)
    for (int m = 0; m < MB; ++m) y[(m0 + m) * N + n0 + n] = _mm512_reduce_add_ps(acc[n][m]) * scale[n0 + n];
}

#endif

// Portable kernel (INTERLOCK_SIMD=0, or a CPU with neither AVX2 nor VNNI), the same per-(m, n)
// order: exact integer lane dots, fused multiply-add into 16 lanes chunk by chunk, a halving tree at
// the end. What every SIMD kernel must equal bit for bit.
template <int NB, int MB>
inline void block_portable(const QuantRows& a, const int8_t* q, const float* scale, float* y,
                           int64_t K, int64_t N, int64_t n0, int64_t m0) {
  for (int n = 0; n < NB; ++n)
    for (int m = 0; m < MB; ++m) {
      float acc[kLanes] = {};
      for (int64_t c = 0; c < a.chunks; ++c)
        for (int64_t lane = 0; lane < kLanes; ++lane) {
          int32_t dot = 0;
          for (int64_t i = 0; i < 4; ++i) {
            const int64_t k = c * kChunk + 4 * lane + i;
            if (k < K) dot += int32_t(q[(n0 + n) * K + k]) * a.qs(m0 + m, c)[4 * lane + i];
          }
          acc[lane] = std::fma(float(dot), a.scales(m0 + m, c)[lane], acc[lane]);
        }
      for (int64_t w = kLanes / 2; w > 0; w /= 2)
        for (int64_t l = 0; l < w; ++l) acc[l] += acc[l + w];
      y[(m0 + m) * N + n0 + n] = acc[0] * scale[n0 + n];
    }
}

// NB output rows x MB activation rows on this machine's kernel.
template <int NB, int MB>
inline void block(const QuantRows& a, const int8_t* q, const float* scale, float* y,
                  int64_t K, int64_t N, int64_t n0, int64_t m0) {
#if defined(INTERLOCK_VNNI)
  block_vnni<NB, MB>(a, q, scale, y, K, N, n0, m0);
#elif defined(INTERLOCK_AVX2)
  block_avx2<NB, MB>(a, q, scale, y, K, N, n0, m0);
#else
  block_portable<NB, MB>(a, q, scale, y, K, N, n0, m0);
#endif
}

// All M rows against output rows n0 .. n0 + NB, two activation rows at a time: the block's weights
// come from memory on the first pair and from L1 after it (NB rows of K bytes).
template <int NB>
inline void rows(const QuantRows& a, const int8_t* q, const float* scale, float* y,
                 int64_t M, int64_t K, int64_t N, int64_t n0) {
#if defined(INTERLOCK_AVX2)
  rows_avx2(a, q, scale, y, M, K, N, n0, NB);      // its own row / output order (int8_avx2.h)
#else
  int64_t m = 0;
  for (; m + 2 <= M; m += 2) block<NB, 2>(a, q, scale, y, K, N, n0, m);
  if (m < M) block<NB, 1>(a, q, scale, y, K, N, n0, m);
#endif
}

// y for all M rows, output rows split across the threads in blocks of NB.
template <int NB>
inline void out_blocks(const QuantRows& a, const int8_t* q, const float* scale, float* y,
                       int64_t M, int64_t K, int64_t N) {
  const int64_t blocks = (N + NB - 1) / NB;
  // 64 output rows per task at least: enough work to hide the fork, small enough to balance.
  at::parallel_for(0, blocks, 64 / NB, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * NB;
      if (n0 + NB <= N) {
        rows<NB>(a, q, scale, y, M, K, N, n0);
      } else {
        for (int64_t n = n0; n < N; ++n) rows<1>(a, q, scale, y, M, K, N, n);
      }
    }
  });
}

// y[M, N] = (x[M, K] . q[N, K]^T) * scale[N], K a multiple of 32; parallel over output rows.
inline void int8_linear_raw(const float* x, const int8_t* q, const float* scale, float* y,
                            int64_t M, int64_t K, int64_t N) {
  thread_local QuantRows scratch;      // reused: a step calls this ~150 times on small rows
  const bool amx = amx_enabled();
#if defined(INTERLOCK_VNNI)
  quantize_rows(x, M, K, scratch, /*with_fix=*/!amx || M == 1);   // the VNNI kernels read the fix
#else
  quantize_rows(x, M, K, scratch, /*with_fix=*/false);             // signed x signed: no fix
#endif
  const QuantRows& a = scratch;        // the caller's buffer, named so the workers read this one
  if (amx) {
    int8_linear_amx(a, q, scale, y, M, K, N);
    return;
  }
  // Prompt chunks take 8 output rows per block: each activation chunk loaded from L2 then feeds
  // 8 dots instead of 4 (measured on Zen 4: prefill +7%). Decode and verify rows keep 4: their
  // weights stream from memory, and 8 rows' streams at once made those steps ~5% slower. Each
  // (row, output) is computed the same way either way: the block size moves no bits.
  if (M >= 16) {
    out_blocks<2 * kOutBlock>(a, q, scale, y, M, K, N);
  } else {
    out_blocks<kOutBlock>(a, q, scale, y, M, K, N);
  }
}

}  // namespace interlock_cpu
