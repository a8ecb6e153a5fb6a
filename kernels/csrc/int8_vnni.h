#pragma once
// Two or more activation rows on AVX512-VNNI (CPUs without AMX, or INTERLOCK_AMX=0): int8_linear.h's
// arithmetic with the weights of 16 output rows transposed, so the bits are every kernel's.
//
// Why: one row's dot (int8_linear.h, tree_sums_vnni) has a chunk's 16 lanes along K, so each
// block's 8 lanes are summed with shuffles, row by row. Here a tile of 16 output rows is transposed
// once into [k-quad][output row][4 bytes], flipped to unsigned: one dpbusd of a k-quad with one
// activation row's 4 values broadcast to every lane then adds 4 products to each of the 16 outputs,
// so a block's 8 dpbusd leave its exact dot d_b in each output's lane, and one convert and one fma
// (the block's scale broadcast) add it to lane b % 4's accumulator of the 16 outputs. Per
// activation row and 16 x 64 weights that is 16 dots, 2 converts and 2 fmas (where one dot, one
// convert and one fma per output and chunk took 48), and the transposition's 64 shuffles are paid
// once for all the rows.
//
// Signs: the transposed weights are w + 128 (unsigned), and each block's accumulator starts at -128
// * the sum of its 32 activation values (QuantRows::block_fix).
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "int8_quant.h"

#if defined(INTERLOCK_VNNI)

namespace interlock_cpu {

constexpr int64_t kVnniTile = 16;       // output rows per transposed tile
constexpr int64_t kVnniRows = 4;        // activation rows per pass over a tile (16 fp32 accumulators)

// r[n] dword k -> r[k] dword n (a 16 x 16 transpose of 4-byte quads).
inline void transpose16(__m512i (&r)[16]) {
  __m512i a[16], b[16];
  for (int i = 0; i < 8; ++i) {          // a[2i] lane q: r[2i][4q], r[2i+1][4q], r[2i][4q+1], r[2i+1][4q+1]
    a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i)            // b[4i + e] lane q: rows 4i .. 4i + 3 of dword 4q + e
    for (int j = 0; j < 2; ++j) {
      b[4 * i + 2 * j] = _mm512_unpacklo_epi64(a[4 * i + j], a[4 * i + 2 + j]);
      b[4 * i + 2 * j + 1] = _mm512_unpackhi_epi64(a[4 * i + j], a[4 * i + 2 + j]);
    }
  for (int e = 0; e < 4; ++e) {          // the 4 x 4 transpose of 128-bit lanes, for each e
    const __m512i c0 = _mm512_shuffle_i32x4(b[e], b[4 + e], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i c1 = _mm512_shuffle_i32x4(b[e], b[4 + e], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512i c2 = _mm512_shuffle_i32x4(b[8 + e], b[12 + e], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i c3 = _mm512_shuffle_i32x4(b[8 + e], b[12 + e], _MM_SHUFFLE(3, 2, 3, 2));
    r[e] = _mm512_shuffle_i32x4(c0, c2, _MM_SHUFFLE(2, 0, 2, 0));
    r[4 + e] = _mm512_shuffle_i32x4(c0, c2, _MM_SHUFFLE(3, 1, 3, 1));
    r[8 + e] = _mm512_shuffle_i32x4(c1, c3, _MM_SHUFFLE(2, 0, 2, 0));
    r[12 + e] = _mm512_shuffle_i32x4(c1, c3, _MM_SHUFFLE(3, 1, 3, 1));
  }
}

// t[kq * 64 + 4 n + j] = w[n][64 c + 4 kq + j] + 128: chunk c of the tile's rows w[n] (K bytes each;
// a last half chunk's other half reads as zero weights), transposed. The next tile's rows, one tile
// on, are prefetched into L2 as these are read, so they arrive while this tile computes (measured on
// this kernel's first Sapphire Rapids host, 2 and 4 rows from L3: spread over the compute instead,
// 0.8x; none, 0.6-0.7x; 8 KB on, 0.9-0.95x).
inline void transpose_chunk(const int8_t* const (&w)[kVnniTile], int64_t K, int64_t c, int8_t* t) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i r[16];
  for (int n = 0; n < 16; ++n) {
    const int8_t* at = w[n] + c * kChunk;
    _mm_prefetch(reinterpret_cast<const char*>(at + kVnniTile * K), _MM_HINT_T1);
    r[n] = _mm512_xor_si512(flip, (c + 1) * kChunk <= K ? _mm512_loadu_si512(at) : _mm512_maskz_loadu_epi8(0xFFFFFFFFull, at));
  }
  transpose16(r);
  for (int kq = 0; kq < 16; ++kq) _mm512_store_si512(t + kq * 64, r[kq]);
}

inline __m512i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Block b from its 8 transposed k-quads (64 bytes apart from `quads`) for activation rows m0 ..
// m0 + MB: acc[m] += float(d_b) * s_b, for the 16 outputs at once.
template <int MB>
inline void tile_block(const int8_t* quads, const QuantRows& a, int64_t m0, int64_t b, __m512 (&acc)[MB]) {
  __m512i d[MB];
  for (int m = 0; m < MB; ++m) d[m] = _mm512_set1_epi32(a.block_fixes(m0 + m)[b]);
  for (int kq = 0; kq < 8; ++kq) {
    const __m512i w = _mm512_load_si512(quads + kq * 64);
    for (int m = 0; m < MB; ++m)
      d[m] = _mm512_dpbusd_epi32(d[m], w, broadcast4(a.qs(m0 + m, b / 2) + (b % 2) * kQBlock + 4 * kq));
  }
  for (int m = 0; m < MB; ++m)
    acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[m]), _mm512_set1_ps(a.scales(m0 + m)[b]), acc[m]);
}

// y[m0 + m][n0 .. n0 + 16) (the `valid` ones) for activation rows m0 .. m0 + MB; chunk(c): chunk c
// of the tile, transposed (1 KB).
template <int MB, class Chunk>
inline void tile_rows(Chunk&& chunk, const QuantRows& a, int64_t K, int64_t m0, const float* scale, float* y,
                      int64_t N, int64_t n0, __mmask16 valid) {
  __m512 acc[4][MB];
  for (int l = 0; l < 4; ++l)
    for (int m = 0; m < MB; ++m) acc[l][m] = _mm512_setzero_ps();
  const int64_t blocks = K / kQBlock;
  for (int64_t b = 0; b < blocks; b += 4) {      // lane b % 4, spelled out so it stays in registers
    const int8_t* t = chunk(b / 2);
    tile_block<MB>(t, a, m0, b, acc[0]);
    if (b + 1 < blocks) tile_block<MB>(t + 512, a, m0, b + 1, acc[1]);
    if (b + 2 >= blocks) continue;
    t = chunk(b / 2 + 1);
    tile_block<MB>(t, a, m0, b + 2, acc[2]);
    if (b + 3 < blocks) tile_block<MB>(t + 512, a, m0, b + 3, acc[3]);
  }
  const __m512 s = _mm512_maskz_loadu_ps(valid, scale + n0);
  for (int m = 0; m < MB; ++m) {
    const __m512 sum = _mm512_add_ps(_mm512_add_ps(acc[0][m], acc[1][m]), _mm512_add_ps(acc[2][m], acc[3][m]));
    _mm512_mask_storeu_ps(y + (m0 + m) * N + n0, valid, _mm512_mul_ps(sum, s));
  }
}

// Activation rows m0 .. m0 + MB (MB < kVnniRows, the last of them), or all M rows in passes of
// kVnniRows, against the tile read by `chunk`.
template <class Chunk>
inline void tile_passes(Chunk&& chunk, const QuantRows& a, int64_t M, int64_t K, const float* scale, float* y,
                        int64_t N, int64_t n0, __mmask16 valid) {
  int64_t m = 0;
  for (; m + kVnniRows <= M; m += kVnniRows) tile_rows<kVnniRows>(chunk, a, K, m, scale, y, N, n0, valid);
  switch (M - m) {
    case 3: tile_rows<3>(chunk, a, K, m, scale, y, N, n0, valid); break;
    case 2: tile_rows<2>(chunk, a, K, m, scale, y, N, n0, valid); break;
    case 1: tile_rows<1>(chunk, a, K, m, scale, y, N, n0, valid); break;
    default: break;
  }
}

// a: M >= 2 rows quantized with the VNNI corrections; parallel over tiles of 16 output rows. Up to
// kVnniRows rows make one pass over a tile: each chunk is transposed into 1 KB and used at once. More
// make several: the tile is transposed once, whole, and read back per pass (a stored 32 KB tile
// read once, at K = 2048, made 2 rows 0.75x: with the tile's weights it overflowed L1).
inline void int8_linear_vnni_rows(const QuantRows& a, const int8_t* q, const float* scale, float* y, int64_t M,
                                  int64_t K, int64_t N) {
  const int64_t tiles = (N + kVnniTile - 1) / kVnniTile;
  const int64_t bytes = M <= kVnniRows ? 1024 : kVnniTile * a.chunks * kChunk;
  at::parallel_for(0, tiles, 4, [&](int64_t t0, int64_t t1) {     // 64 output rows per task at least
    thread_local std::vector<int8_t> buffer;
    if (static_cast<int64_t>(buffer.size()) < bytes + 64) buffer.resize(bytes + 64);
    int8_t* t = reinterpret_cast<int8_t*>((reinterpret_cast<uintptr_t>(buffer.data()) + 63) & ~uintptr_t{63});
    for (int64_t tile = t0; tile < t1; ++tile) {
      const int64_t n0 = tile * kVnniTile, valid = std::min(kVnniTile, N - n0);
      const int8_t* w[kVnniTile];
      for (int64_t n = 0; n < kVnniTile; ++n) w[n] = q + (n0 + std::min(n, valid - 1)) * K;   // past N: discarded
      const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1);
      if (M <= kVnniRows) {
        tile_passes([&](int64_t c) { transpose_chunk(w, K, c, t); return static_cast<const int8_t*>(t); },
                    a, M, K, scale, y, N, n0, mask);
      } else {
        for (int64_t c = 0; c < a.chunks; ++c) transpose_chunk(w, K, c, t + c * 1024);
        tile_passes([&](int64_t c) { return static_cast<const int8_t*>(t + c * 1024); }, a, M, K, scale, y, N, n0, mask);
      }
    }
  });
}

}  // namespace interlock_cpu

#endif
