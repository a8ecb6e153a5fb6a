#pragma once
// y[M, N] = (x[M, K] . q[N, K]^T) * scale[N] on AMX tiles: int8_linear.h's int8 x int8 product
// (activations in blocks of 32, quantize_rows) with its arithmetic, so with the bits of every other
// kernel, for CPUs with AMX-INT8 (Sapphire Rapids and later).
//
// Why: on VNNI every activation row costs its own dot instructions per 64 weights and output rows,
// so 4 rows are compute-bound (over all weights, 4 rows took 1.4x one row). One tile dot multiplies
// 16 output rows by 16 columns over 64 weights; the activation rows of a step fit in its columns,
// so 1 and 4 rows cost the same tile work and a verify step reads the weights at the speed a decode
// step does. One row alone takes the VNNI kernel (int8_linear_raw).
//
// Layout. A (tile 1): 16 weight rows x one 64-weight chunk, read in place (row stride K).
// B (tile 2): the chunk's activations, 16 rows of 4 consecutive k x 16 columns. Up to 4
// activation rows per pass; row m owns columns 4m + 2g + h: g the chunk's parity, h its half
// (quantization block 2c + h); the other k of a column are zero. So after two chunks each column of
// C (tile 0, int32) holds one block's exact integer dot for one (output row, activation row): the
// d_b of int8_linear.h. It is stored, converted and fma'd with the block's scale into 16 fp32 lanes
// per output row, lane 4m + 2g + h being row m's lane b % 4, in block order, and C is zeroed. At the
// end a row's four lanes are added in int8_linear.h's tree and scaled by scale[n]. Nothing in row
// m's arithmetic depends on the other rows: batch invariant.
//
// The tiles need the kernel's permission (arch_prctl, once per process); where it is refused, or
// INTERLOCK_AMX=0, the VNNI kernel runs instead, for the whole process.
#include <ATen/Parallel.h>

#include <cstdlib>
#include <cstring>

#include "int8_quant.h"

#if defined(__AMX_INT8__) && defined(__AMX_TILE__) && defined(INTERLOCK_VNNI)
#define INTERLOCK_HAVE_AMX 1
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace interlock_cpu {

#if defined(INTERLOCK_HAVE_AMX)

constexpr int64_t kTileRows = 16;       // output rows per tile (and task)
constexpr int64_t kRowsPerPass = 4;     // activation rows per pass: 4 columns each

// Whether this process may use the tiles: asked once, the answer kept.
inline bool amx_enabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("INTERLOCK_AMX");
    if (env != nullptr && std::strcmp(env, "0") == 0) return false;
    constexpr long kReqXcompPerm = 0x1023, kXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0;
  }();
  return enabled;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-7 shaped rows[t] x cols[t] bytes, for this thread.
inline void load_tiles(const int (&rows)[8], const int (&cols)[8]) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = static_cast<uint8_t>(rows[t]);
    cfg.colsb[t] = static_cast<uint16_t>(cols[t]);
  }
  _tile_loadconfig(&cfg);
}

// Tiles: 0, 1 C [16 x 16 int32] (alternate pairs of chunks, so one pair's products are stored
// while the next pair's dots run); 2, 3 A [16 x 64 B] and 4, 5 B [16 x 64 B] (alternate chunks);
// for a last half chunk (K % 64 == 32) 6 A [16 x 32 B] and 7 B [8 x 64 B].
inline void load_tile_config() {
  static constexpr int rows[8] = {16, 16, 16, 16, 16, 16, 16, 8}, cols[8] = {64, 64, 64, 64, 64, 64, 32, 64};
  load_tiles(rows, cols);
}

// The activations as B tiles and lane scales, per pass of up to 4 rows: tiles [pass][chunk][16 x
// 64 B], scales [pass][chunk pair][16] (lane 4m + 2g + h: the scale of block 2(2p + g) + h).
struct AmxRows {
  int64_t passes = 0, chunks = 0, pairs = 0;
  Lines<int8_t> tiles;
  std::vector<float> scales;

  const int8_t* tile(int64_t p, int64_t c) const { return tiles.data() + (p * chunks + c) * 1024; }
  const float* pair_scales(int64_t p, int64_t pair) const { return scales.data() + (p * pairs + pair) * 16; }
};

// The B tiles are mostly zero (a row fills 4 of 16 columns, half their k); the zeros stay where
// they are between calls of the same shape, so only the row data is written each time.
inline void amx_rows(const QuantRows& a, int64_t M, AmxRows& out) {
  const int64_t passes = (M + kRowsPerPass - 1) / kRowsPerPass;
  if (passes != out.passes || a.chunks != out.chunks) {
    out.passes = passes;
    out.chunks = a.chunks;
    out.pairs = (a.chunks + 1) / 2;
    out.tiles.assign(out.passes * out.chunks * 1024);
    out.scales.assign(out.passes * out.pairs * 16, 0.f);
  }
  for (int64_t m = 0; m < M; ++m) {
    const int64_t p = m / kRowsPerPass, mm = m % kRowsPerPass;
    for (int64_t c = 0; c < a.chunks; ++c) {
      int32_t* tile = reinterpret_cast<int32_t*>(out.tiles.data() + (p * out.chunks + c) * 1024);
      const int8_t* q = a.qs(m, c);
      const int64_t col = 4 * mm + 2 * (c % 2);
      for (int64_t r = 0; r < 16; ++r)              // tile row r: k = 4r .. 4r + 3, half r / 8
        std::memcpy(tile + r * 16 + col + r / 8, q + 4 * r, 4);
      for (int64_t h = 0; h < 2; ++h) out.scales[(p * out.pairs + c / 2) * 16 + col + h] = a.scales(m)[2 * c + h];
    }
  }
}

// C tile `ct` += the dots of chunks c0, c0 + 1. GCC's tile intrinsics paste their tile numbers
// into register names, so each tile number is spelled out.
#define INTERLOCK_TILE_DOT(C, A, B)                       \
  do {                                                   \
    _tile_loadd(A, w + c * kChunk, K);                   \
    _tile_loadd(B, act.tile(pass, c), 64);               \
    _tile_dpbssd(C, A, B);                               \
  } while (0)

inline void pair_dots(int ct, const AmxRows& act, const int8_t* w, int64_t K, int64_t pass, int64_t c0) {
  const int64_t full = K / kChunk;
  for (int64_t c = c0; c < std::min(c0 + 2, act.chunks); ++c) {
    if (ct == 0) {
      if (c >= full) INTERLOCK_TILE_DOT(0, 6, 7);
      else if (c % 2 == 0) INTERLOCK_TILE_DOT(0, 2, 4);
      else INTERLOCK_TILE_DOT(0, 3, 5);
    } else {
      if (c >= full) INTERLOCK_TILE_DOT(1, 6, 7);
      else if (c % 2 == 0) INTERLOCK_TILE_DOT(1, 2, 4);
      else INTERLOCK_TILE_DOT(1, 3, 5);
    }
  }
}
#undef INTERLOCK_TILE_DOT

// acc[n] += C[n] (int32 -> fp32, exact) * the pair's lane scales; C zeroed.
inline void flush(int ct, const float* pair_scales, __m512 (&acc)[16]) {
  alignas(64) int32_t out[16 * 16];
  if (ct == 0) {
    _tile_stored(0, out, 64);
    _tile_zero(0);
  } else {
    _tile_stored(1, out, 64);
    _tile_zero(1);
  }
  const __m512 s = _mm512_loadu_ps(pair_scales);
  for (int n = 0; n < 16; ++n)
    acc[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(out + 16 * n)), s, acc[n]);
}

// Output rows n0 .. n0 + 16 of w (row stride K) for every activation row.
inline void amx_tile_rows(const AmxRows& act, const int8_t* w, int64_t K, const float* scale, float* y,
                          int64_t M, int64_t N, int64_t n0, int64_t valid_rows, const int8_t* prefetch) {
  alignas(64) float lanes[16];
  for (int64_t p = 0; p < act.passes; ++p) {
    __m512 acc[16];
    for (int n = 0; n < 16; ++n) acc[n] = _mm512_setzero_ps();
    _tile_zero(0);
    _tile_zero(1);
    for (int64_t pair = 0; pair < act.pairs; ++pair) {
      // The next 16 rows are contiguous: pull two chunks' worth of their lines per pair, in address
      // order, so the tile loads of the next task find them in cache (the tile rows are K apart,
      // which the hardware prefetchers follow poorly).
      if (p == 0 && prefetch != nullptr)
        for (int64_t r = 0; r < 32 && (pair * 32 + r) * 64 < 16 * K; ++r)
          _mm_prefetch(reinterpret_cast<const char*>(prefetch + (pair * 32 + r) * 64), _MM_HINT_T1);
      // Pair `pair` into one C tile, then the previous pair's tile into the lanes, in pair order.
      pair_dots(pair % 2, act, w, K, p, 2 * pair);
      if (pair > 0) flush((pair - 1) % 2, act.pair_scales(p, pair - 1), acc);
    }
    flush((act.pairs - 1) % 2, act.pair_scales(p, act.pairs - 1), acc);
    const int64_t m_end = std::min<int64_t>(M, (p + 1) * kRowsPerPass);
    for (int64_t n = 0; n < valid_rows; ++n) {
      _mm512_store_ps(lanes, acc[n]);
      for (int64_t m = p * kRowsPerPass; m < m_end; ++m) {
        const float* l = lanes + 4 * (m % kRowsPerPass);
        y[m * N + n0 + n] = ((l[0] + l[1]) + (l[2] + l[3])) * scale[n0 + n];
      }
    }
  }
}

// Many rows (a prompt chunk): 16 activation rows per B tile, one quantization block per dot.
//
// The pass kernel above gives each row 4 of B's 16 columns, so it reads every weight tile once per
// 4 rows; a 256-row chunk would read the weights 64 times. Here B holds one 32-value block of 16
// rows (tile row r: values 4r .. 4r + 3, column m: activation row m) against A = 16 weight rows x
// the same 32 values, so C[n][m] is that block's exact integer dot, as a column of the pass
// kernel's C holds. The fp32 work is int8_linear.h's: lane l = b % 4 of (n, m) gets blocks l,
// l + 4, ... by FMA in block order, and the same final tree. So every row's bits equal the pass
// and VNNI kernels': a prompt row computed here equals that row decoded, whatever the chunk.
constexpr int64_t kGroupRows = 16;      // activation rows per B tile
constexpr int64_t kGemmMinRows = 12;    // fewer: the pass kernel (8 rows 4.6 vs 5.6 ms, 12 rows 6.7 vs 5.8)

// Tiles: 0-3 C [16 x 16 int32] (a ring: a block's products are read two dots after its own);
// 4, 5 A [16 x 32 B] and 6, 7 B [8 x 64 B] (alternate blocks).
inline void load_group_tile_config() {
  static constexpr int rows[8] = {16, 16, 16, 16, 16, 16, 8, 8}, cols[8] = {64, 64, 64, 64, 32, 32, 64, 64};
  load_tiles(rows, cols);
}

// The activations as B tiles [group][block][8 x 64 B] and scales [group][block][16] (0 past M).
struct AmxGroups {
  int64_t groups = 0, blocks = 0;
  Lines<int8_t> tiles;
  std::vector<float> scales;

  const int8_t* tile(int64_t g, int64_t b) const { return tiles.data() + (g * blocks + b) * 512; }
  const float* block_scales(int64_t g, int64_t b) const { return scales.data() + (g * blocks + b) * 16; }
};

inline void amx_groups(const QuantRows& a, int64_t M, int64_t K, AmxGroups& out) {
  out.groups = (M + kGroupRows - 1) / kGroupRows;
  out.blocks = K / kQBlock;
  out.tiles.resize(out.groups * out.blocks * 512);
  out.scales.resize(out.groups * out.blocks * 16);
  at::parallel_for(0, out.groups, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g)
      for (int64_t b = 0; b < out.blocks; ++b) {
        int32_t* tile = reinterpret_cast<int32_t*>(out.tiles.data() + (g * out.blocks + b) * 512);
        float* s = out.scales.data() + (g * out.blocks + b) * 16;
        for (int64_t m = 0; m < kGroupRows; ++m) {
          const int64_t row = g * kGroupRows + m;
          if (row >= M) {                  // padding rows: zero values, zero scale
            for (int64_t r = 0; r < 8; ++r) tile[r * 16 + m] = 0;
            s[m] = 0.f;
            continue;
          }
          const int8_t* q = a.qs(row, b / 2) + kQBlock * (b % 2);
          for (int64_t r = 0; r < 8; ++r) std::memcpy(tile + r * 16 + m, q + 4 * r, 4);
          s[m] = a.scales(row)[b];
        }
      }
  });
}

// C tile `ct` = block b's dots of 16 weight rows (w, row stride K) x group g's 16 rows.
#define INTERLOCK_BLOCK_DOT(C, A, B)                                   \
  do {                                                                \
    _tile_zero(C);                                                    \
    _tile_loadd(A, w + (b / 2) * kChunk + (b % 2) * kQBlock, K);      \
    _tile_loadd(B, act.tile(g, b), 64);                               \
    _tile_dpbssd(C, A, B);                                            \
  } while (0)

inline void block_dot(int ct, const AmxGroups& act, const int8_t* w, int64_t K, int64_t g, int64_t b) {
  switch (ct) {
    case 0: INTERLOCK_BLOCK_DOT(0, 4, 6); break;
    case 1: INTERLOCK_BLOCK_DOT(1, 5, 7); break;
    case 2: INTERLOCK_BLOCK_DOT(2, 4, 6); break;
    default: INTERLOCK_BLOCK_DOT(3, 5, 7); break;
  }
}
#undef INTERLOCK_BLOCK_DOT

// lane[n] += C[n] (int32 -> fp32, exact) * the block's scales, for the 16 output rows n.
inline void flush_lane(int ct, const float* block_scales, float (*lane)[16]) {
  alignas(64) int32_t out[16 * 16];
  switch (ct) {
    case 0: _tile_stored(0, out, 64); break;
    case 1: _tile_stored(1, out, 64); break;
    case 2: _tile_stored(2, out, 64); break;
    default: _tile_stored(3, out, 64); break;
  }
  const __m512 s = _mm512_loadu_ps(block_scales);
  for (int n = 0; n < 16; ++n)
    _mm512_store_ps(lane[n], _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(out + 16 * n)), s,
                                             _mm512_load_ps(lane[n])));
}

// Output rows n0 .. n0 + 16 of w for every activation row. The (group, block) pairs run as one
// stream: block i's dot is issued, then block i - 2's products (two dots old, so ready) go into
// its lane, so the tile unit and the vector units overlap instead of waiting on each other.
inline void amx_group_rows(const AmxGroups& act, const int8_t* w, int64_t K, const float* scale, float* y,
                           int64_t M, int64_t N, int64_t n0, int64_t valid_rows, const int8_t* prefetch) {
  alignas(64) float lanes[2][4][16][16] = {};     // [group parity][lane][output row][activation row]
  const int64_t total = act.groups * act.blocks, lines = 16 * K / 64;
  for (int64_t i = 0; i < total + 2; ++i) {
    // The next tile's weights, a few lines per dot while this one computes (all at once, the
    // prefetches queued behind each other and stalled the loop).
    if (prefetch != nullptr)
      for (int64_t line = i * lines / total; line < std::min(lines, (i + 1) * lines / total); ++line)
        _mm_prefetch(reinterpret_cast<const char*>(prefetch + line * 64), _MM_HINT_T1);
    if (i < total) block_dot(static_cast<int>(i % 4), act, w, K, i / act.blocks, i % act.blocks);
    const int64_t j = i - 2;
    if (j < 0 || j >= total) continue;
    const int64_t g = j / act.blocks, b = j % act.blocks;
    float (*lane)[16][16] = lanes[g % 2];
    flush_lane(static_cast<int>(j % 4), act.block_scales(g, b), lane[b % 4]);
    if (b + 1 < act.blocks) continue;
    // The group's last block is in: the final tree, then its lanes are zeroed for group g + 2.
    alignas(64) float out[16][16];                // [output row][activation row]
    for (int n = 0; n < 16; ++n) {
      const __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_load_ps(lane[0][n]), _mm512_load_ps(lane[1][n])),
                                       _mm512_add_ps(_mm512_load_ps(lane[2][n]), _mm512_load_ps(lane[3][n])));
      _mm512_store_ps(out[n], _mm512_mul_ps(sum, _mm512_set1_ps(n < valid_rows ? scale[n0 + n] : 0.f)));
    }
    // One 64-byte store per activation row (a column of `out`): scattered 4-byte stores into y,
    // whose rows are N * 4 bytes apart, thrashed one L1 set when that is a multiple of 4 KB.
    const __m512i column = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                              _mm512_set1_epi32(16));
    const __mmask16 valid = static_cast<__mmask16>((1u << valid_rows) - 1);
    const int64_t m0 = g * kGroupRows, m_end = std::min(M, m0 + kGroupRows);
    for (int64_t m = m0; m < m_end; ++m)
      _mm512_mask_storeu_ps(y + m * N + n0, valid,
                            _mm512_i32gather_ps(_mm512_add_epi32(column, _mm512_set1_epi32(static_cast<int>(m - m0))),
                                                &out[0][0], 4));
    std::memset(lane, 0, sizeof(lanes[0]));
  }
}

inline void int8_linear_amx_groups(const QuantRows& a, const int8_t* q, const float* scale, float* y,
                                   int64_t M, int64_t K, int64_t N) {
  thread_local AmxGroups scratch;
  amx_groups(a, M, K, scratch);
  const AmxGroups& act = scratch;
  const int64_t tiles = (N + kTileRows - 1) / kTileRows;
  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    load_group_tile_config();
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = t * kTileRows, valid = std::min(kTileRows, N - n0);
      if (valid == kTileRows) {
        const bool more = t + 1 < t1 && n0 + 2 * kTileRows <= N;
        amx_group_rows(act, q + n0 * K, K, scale, y, M, N, n0, valid, more ? q + (n0 + kTileRows) * K : nullptr);
      } else {
        std::vector<int8_t> pad(kTileRows * K, 0);
        std::memcpy(pad.data(), q + n0 * K, valid * K);
        amx_group_rows(act, pad.data(), K, scale, y, M, N, n0, valid, nullptr);
      }
    }
  });
}

// a: the quantized rows, M > 1 (one row takes int8_linear.h's VNNI kernel: the same bits).
inline void int8_linear_amx(const QuantRows& a, const int8_t* q, const float* scale, float* y,
                            int64_t M, int64_t K, int64_t N) {
  if (M >= kGemmMinRows) {
    int8_linear_amx_groups(a, q, scale, y, M, K, N);
    return;
  }
  thread_local AmxRows by_k[2];         // a layer alternates K = E and K = I: one buffer each
  AmxRows& scratch = by_k[by_k[0].chunks == a.chunks ? 0 : by_k[1].chunks == a.chunks ? 1 : (a.chunks & 1)];
  amx_rows(a, M, scratch);
  const AmxRows& act = scratch;          // the caller's buffer, named so the workers read this one
  const int64_t tiles = (N + kTileRows - 1) / kTileRows;
  // 4 tiles (64 output rows) per task at least, as the VNNI kernel.
  at::parallel_for(0, tiles, 4, [&](int64_t t0, int64_t t1) {
    load_tile_config();                  // per task: other code on this thread (oneDNN) sets its own
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = t * kTileRows, valid = std::min(kTileRows, N - n0);
      if (valid == kTileRows) {
        const bool more = n0 + 2 * kTileRows <= N;          // a whole next tile to prefetch
        amx_tile_rows(act, q + n0 * K, K, scale, y, M, N, n0, valid, more ? q + (n0 + kTileRows) * K : nullptr);
      } else {                           // the last rows, zero-padded to a whole tile
        std::vector<int8_t> pad(kTileRows * K, 0);
        std::memcpy(pad.data(), q + n0 * K, valid * K);
        amx_tile_rows(act, pad.data(), K, scale, y, M, N, n0, valid, nullptr);
      }
    }
  });
}

#else

inline bool amx_enabled() { return false; }
inline void int8_linear_amx(const QuantRows&, const int8_t*, const float*, float*, int64_t, int64_t, int64_t) {}

#endif

}  // namespace interlock_cpu
