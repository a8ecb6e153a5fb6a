#pragma once
// int4_linear.h's arithmetic for two or more rows (a verify step's K + 1 rows, a prompt chunk's 256)
// on AVX512-VNNI. int4_linear.h includes this after the format's definitions and calls it for M >= 2.
//
// Why: the one-row kernel multiplies a row's int8 activations by the nibbles (maddubs), spreads the
// blocks' multipliers sc_b * 2^(7 - e_b) over the lanes (a permute) and adds the pairs into int32
// (dpwssd): 3 vector ops per 64-weight chunk and row. Here both factors are widened to int16 once,
// each weight to sc_b * q (|.| <= 1920) once per output, each activation to xq * 2^(7 - e_b)
// (|.| <= 16256) once per row, so that a chunk costs a row 2 dpwssd, and the weights' widening
// (2 maddubs per chunk) is paid once for all the rows that meet them.
//
// The same bits: lane l of chunk c still sums the products of the chunk's weights 4l .. 4l + 3 (in
// two int16 pairs: one vector holds the chunk's even weights, lane l taking 4l and 4l + 2, the other
// the odd ones), each product sc_b * q * xq * 2^(7 - e_b) exact, and integer sums do not depend on
// their order, so isum_l is the portable kernel's (|product| < 2^25, a lane's 16 products of a
// super-block < 2^29: no int32 overflow). Every fp32 step after it is the portable kernel's too: one
// fma per super-block in K order with (D_g * A_g) * (1 / 128), the halving tree, the offsets pass.
//
// Per super-block, row and output that is 8 dpwssd + convert + fma (10 vector ops for 256 weights;
// the int8 kernel's dpbusd path takes 12: 4 x (dpbusd, convert, fma)), plus the widening (~24 ops
// per output) shared by the rows. Up to 4 rows (a verify step) the widening is a third of the work:
// there the old scheme cost about as many ops, and the gain (~0.7x the time on Sapphire Rapids) is
// from the tiles' scheduling; prompt chunks take ~0.45x.
//
// Blocking (none of it moves a bit): a tile of MR <= 4 rows x NR <= 3 outputs keeps its 12 fp32
// accumulators and 12 int32 sums in registers, and per vector step loads 3 weight and 4 activation
// vectors for 12 dpwssd. Up to 4 rows, each output's super-block is widened into an L1 buffer just
// before the tile reads it (the records stream from memory once). More rows widen an output block's
// whole rows once into a panel, which groups of 4 rows then read, blocks of 64 rows at a time and K
// in slices of 8 super-blocks, so that a slice's panel and a group's activations stay in L1. The
// tiles end in one halving tree for 16 sums at once. AVX2 and portable builds keep int4_linear.h's
// kernels, which compute the same bits.
#include <cstdint>
#include <vector>

namespace interlock_cpu {

#if defined(INTERLOCK_VNNI)

constexpr int64_t kI4Vec = 32;                  // int16 per vector
constexpr int64_t kI4Wide = 8 * kI4Vec;         // int16 per super-block: 2 vectors per chunk
constexpr int kI4TileRows = 4, kI4TileOuts = 3;
constexpr int64_t kI4RowBlock = 64;             // rows whose widened activations stay in L2 while the panels pass
constexpr int64_t kI4KSlice = 8;                // super-blocks of K a group of rows takes at a time

// 64-byte aligned int16 storage that keeps its capacity between calls.
struct I4Buffer {
  std::vector<int16_t> raw;
  int16_t* data = nullptr;
  int16_t* get(int64_t n) {
    if (static_cast<int64_t>(raw.size()) < n + 32) raw.resize(n + 32);
    data = reinterpret_cast<int16_t*>((reinterpret_cast<uintptr_t>(raw.data()) + 63) & ~uintptr_t(63));
    return data;
  }
};

// The activation rows widened: per row and super-block 8 vectors (2c: chunk c's even values, 2c + 1:
// its odd ones) of xq * 2^(7 - e_b); and the super-blocks' scales transposed ([G][M]), so that a
// tile's rows are adjacent.
struct I4Wide {
  int64_t M = 0, G = 0;
  I4Buffer x;
  std::vector<float> at;
  const int16_t* rows(int64_t m, int64_t g) const { return x.data + (m * G + g) * kI4Wide; }
  const float* scales(int64_t m, int64_t g) const { return at.data() + g * M + m; }
};

inline void i4_widen(const I4Rows& a, int64_t M, I4Wide& out) {
  out.M = M;
  out.G = a.G;
  int16_t* base = out.x.get(M * a.G * kI4Wide);
  out.at.resize(a.G * M);
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m)
      for (int64_t g = 0; g < a.G; ++g) {
        const int64_t chunks = i4_super_weights(a.K, g) / kI4Chunk;
        const int8_t* xq = a.qs(m) + g * kI4Super;
        const int16_t* p2 = a.pow2s(m) + g * (kI4Super / kI4Block);
        int16_t* dst = base + (m * a.G + g) * kI4Wide;
        for (int64_t c = 0; c < chunks; ++c) {
          const __m512i v = _mm512_loadu_si512(xq + c * kI4Chunk);
          const __m512i p = _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_set1_epi16(p2[2 * c]),
                                                    _mm512_set1_epi16(p2[2 * c + 1]));   // words 16-31: block 2c + 1
          const __m512i even = _mm512_srai_epi16(_mm512_slli_epi16(v, 8), 8), odd = _mm512_srai_epi16(v, 8);
          _mm512_store_si512(dst + 2 * c * kI4Vec, _mm512_mullo_epi16(even, p));
          _mm512_store_si512(dst + (2 * c + 1) * kI4Vec, _mm512_mullo_epi16(odd, p));
        }
        out.at[g * M + m] = a.scale[m * a.G + g];
      }
  });
}

// vpshufb indices that spread a chunk's two sub-scales (sc_2c over bytes 0-31, sc_2c+1 over 32-63)
// from a vector holding the super-block's 8 in every 128-bit lane.
struct I4Spread {
  alignas(64) int8_t idx[4][64];
};
constexpr I4Spread i4_spread_table() {
  I4Spread t{};
  for (int c = 0; c < 4; ++c)
    for (int i = 0; i < 64; ++i) t.idx[c][i] = static_cast<int8_t>(2 * c + i / 32);
  return t;
}
alignas(64) inline constexpr I4Spread kI4Spread = i4_spread_table();

// One output's super-block of W weights (its records at rec) as 2 * W / 64 vectors of sc_b * q, laid
// out as i4_widen lays out the activations. maddubs multiplies the nibble bytes by the sub-scale
// bytes and adds each pair, of which the mask has zeroed one.
__attribute__((always_inline)) inline void i4_unpack(const uint8_t* rec, int64_t W, int16_t* out) {
  const int64_t chunks = W / kI4Chunk;
  const __m512i lo = _mm512_set1_epi16(0x000F), hi = _mm512_set1_epi16(0x0F00);
  const __mmask16 k = static_cast<__mmask16>((1u << (W / kI4Block)) - 1);
  const __m512i sc = _mm512_broadcast_i32x4(_mm_maskz_loadu_epi8(k, rec + W / 2));
  const auto spread = [&](int64_t c) { return _mm512_shuffle_epi8(sc, _mm512_load_si512(kI4Spread.idx[c])); };
  int64_t c = 0;
  for (; c + 1 < chunks; c += 2) {              // a pair: byte i holds weight i of chunk c low, of c + 1 high
    const __m512i v = _mm512_loadu_si512(rec + 32 * c), t = _mm512_srli_epi16(v, 4);
    const __m512i s0 = spread(c), s1 = spread(c + 1);
    _mm512_store_si512(out + 2 * c * kI4Vec, _mm512_maddubs_epi16(_mm512_and_si512(v, lo), s0));
    _mm512_store_si512(out + (2 * c + 1) * kI4Vec, _mm512_maddubs_epi16(_mm512_and_si512(v, hi), s0));
    _mm512_store_si512(out + (2 * c + 2) * kI4Vec, _mm512_maddubs_epi16(_mm512_and_si512(t, lo), s1));
    _mm512_store_si512(out + (2 * c + 3) * kI4Vec, _mm512_maddubs_epi16(_mm512_and_si512(t, hi), s1));
  }
  if (c < chunks) {                             // the unpaired last chunk: byte i holds weights i and 32 + i
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 32 * c));
    const __m256i l4 = _mm256_set1_epi8(0x0F);
    const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(u, l4)),
                                         _mm256_and_si256(_mm256_srli_epi16(u, 4), l4), 1);
    const __m512i s = spread(c);
    _mm512_store_si512(out + 2 * c * kI4Vec, _mm512_maddubs_epi16(_mm512_and_si512(q, _mm512_set1_epi16(0x00FF)), s));
    _mm512_store_si512(out + (2 * c + 1) * kI4Vec,
                       _mm512_maddubs_epi16(_mm512_and_si512(q, _mm512_set1_epi16(static_cast<int16_t>(0xFF00))), s));
  }
}

// A block of outputs' offsets as fp32 ([NR][B]), for the tiles' offsets pass.
template <int NR>
inline void i4_offsets_f32(const c10::Half* off, int64_t B, float* out) {
  for (int n = 0; n < NR; ++n) {
    int64_t b = 0;
    for (; b + 16 <= B; b += 16)
      _mm512_storeu_ps(out + n * B + b, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(off + n * B + b))));
    for (; b < B; ++b) out[n * B + b] = static_cast<float>(off[n * B + b]);
  }
}

// One super-block of a tile: J vectors (2 per chunk) of MR rows (x: each row's first) against NR
// outputs (w: [NR][8] vectors), then acc = fma(float(isum), da, acc) with da[n][m] = (D * A) / 128.
// The first vector's products go through madd (dpwssd onto zero, without a zeroed register).
template <int MR, int NR, int J>
inline void i4_tile_step(const int16_t* const (&x)[MR], const int16_t* w, const float* da, __m512 (&acc)[MR][NR]) {
  __m512i isum[MR][NR];
#pragma GCC unroll 8
  for (int j = 0; j < J; ++j) {
    __m512i wv[NR];
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) wv[n] = _mm512_load_si512(w + (n * 8 + j) * kI4Vec);
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) {
      const __m512i xv = _mm512_load_si512(x[m] + j * kI4Vec);
#pragma GCC unroll 4
      for (int n = 0; n < NR; ++n)
        isum[m][n] = j == 0 ? _mm512_madd_epi16(wv[n], xv) : _mm512_dpwssd_epi32(isum[m][n], wv[n], xv);
    }
  }
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n)
      acc[m][n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[m][n]), _mm512_set1_ps(da[n * 4 + m]), acc[m][n]);
}

// The tile's (D * A) * (1 / 128) for super-block g, as the portable kernel rounds it: da[n * 4 + m].
template <int MR, int NR>
inline void i4_tile_scales(const I4Wide& x, const float* d, int64_t m0, int64_t g, float* da) {
  const __m128 a = _mm_maskz_loadu_ps(static_cast<__mmask8>((1u << MR) - 1), x.scales(m0, g));
#pragma GCC unroll 4
  for (int n = 0; n < NR; ++n) _mm_storeu_ps(da + 4 * n, _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(d[n]), a), _mm_set1_ps(1.f / 128)));
}

// Super-block g (of `chunks` chunks) of rows m0 .. m0 + MR against NR outputs whose widened weights
// are at w, with the scales da.
template <int MR, int NR>
inline void i4_tile(const I4Wide& x, const int16_t* w, const float* da, int64_t m0, int64_t g, int64_t chunks,
                    __m512 (&acc)[MR][NR]) {
  const int16_t* rows[MR];
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m) rows[m] = x.rows(m0 + m, g);
  switch (chunks) {
    case 4: i4_tile_step<MR, NR, 8>(rows, w, da, acc); break;
    case 3: i4_tile_step<MR, NR, 6>(rows, w, da, acc); break;
    case 2: i4_tile_step<MR, NR, 4>(rows, w, da, acc); break;
    default: i4_tile_step<MR, NR, 2>(rows, w, da, acc); break;
  }
}

template <int MR, int NR>
inline void i4_tile_zero(__m512 (&acc)[MR][NR]) {
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_setzero_ps();
}

// The halving trees of 16 vectors at once (as the portable kernel adds: lane l + lane l + 8, then
// + 4, + 2, + 1, in that operand order): element 4k + i of the result is v[4i + k]'s sum.
inline __m512 i4_sum16(const __m512 (&v)[16]) {
  __m512 s[8], w[4], z[2];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)                   // lanes 0-7: v[2i]'s l + (l + 8); 8-15: v[2i + 1]'s
    s[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)                   // quarter q: v[4i + q]'s l + (l + 4)
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(s[2 * i], s[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(s[2 * i], s[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i)                   // quarter q: v[8i + q]'s, v[8i + 4 + q]'s l + (l + 2)
    z[i] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// y = halving tree(main) + halving tree(offsets) for the tile's rows and outputs; the offsets (offp:
// the outputs' [NR][B] as fp32) are fma'd in 16 lanes, block b into lane b % 16, in K order, as
// i4_offsets does.
template <int MR, int NR>
inline void i4_tile_finish(const I4Rows& a, const float* offp, const __m512 (&acc)[MR][NR], float* y, int64_t m0,
                           int64_t n0, int64_t N) {
  __m512 main[16], offs[16];
#pragma GCC unroll 16
  for (int t = 0; t < 16; ++t) main[t] = offs[t] = _mm512_setzero_ps();
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) main[m * NR + n] = acc[m][n];
  const int64_t B = a.B;
  int64_t b = 0;
  for (; b + 16 <= B; b += 16) {
    __m512 o[NR];
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) o[n] = _mm512_loadu_ps(offp + n * B + b);
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) {
      const __m512 s = _mm512_loadu_ps(a.bsum.data() + (m0 + m) * B + b);
#pragma GCC unroll 4
      for (int n = 0; n < NR; ++n) offs[m * NR + n] = _mm512_fmadd_ps(o[n], s, offs[m * NR + n]);
    }
  }
  if (b < B) {                                  // a masked fma: lanes past the end keep their value
    const __mmask16 k = static_cast<__mmask16>((1u << (B - b)) - 1);
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) {
      const __m512 s = _mm512_maskz_loadu_ps(k, a.bsum.data() + (m0 + m) * B + b);
#pragma GCC unroll 4
      for (int n = 0; n < NR; ++n)
        offs[m * NR + n] = _mm512_mask3_fmadd_ps(_mm512_maskz_loadu_ps(k, offp + n * B + b), s, offs[m * NR + n], k);
    }
  }
  alignas(64) float out[16];
  _mm512_store_ps(out, _mm512_add_ps(i4_sum16(main), i4_sum16(offs)));
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NR; ++n) {
      const int t = m * NR + n;
      y[(m0 + m) * N + n0 + n] = out[4 * (t % 4) + t / 4];
    }
}

// A thread's buffers: widened weights (one super-block per output, or a panel of whole rows), their
// scales D, the tiles' (D * A) / 128, the offsets as fp32.
struct I4Scratch {
  I4Buffer w;
  std::vector<float> d, da, off;
  std::vector<float> acc;              // [kI4RowBlock][kI4TileOuts][16]: each group's accumulators between K slices
};

// Up to 4 rows against outputs n0 .. n0 + NR: each super-block widened into L1 and read once.
template <int MR, int NR>
inline void i4_stream(const I4Rows& a, const I4Wide& x, const uint8_t* w, const c10::Half* off, int64_t stride,
                      float* y, int64_t N, int64_t n0, I4Scratch& s) {
  int16_t* buf = s.w.data;
  float* offp = s.off.data();
  i4_offsets_f32<NR>(off + n0 * a.B, a.B, offp);
  __m512 acc[MR][NR];
  i4_tile_zero(acc);
  int64_t offset = 0;
  for (int64_t g = 0; g < a.G; ++g) {
    const int64_t W = i4_super_weights(a.K, g);
    float d[NR];
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) {
      const uint8_t* rec = w + (n0 + n) * stride + offset;
      _mm_prefetch(reinterpret_cast<const char*>(rec + kI4Prefetch), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(rec + kI4Prefetch + 64), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(rec + kI4Prefetch + 128), _MM_HINT_T1);
      i4_unpack(rec, W, buf + n * kI4Wide);
      d[n] = half_to_float(rec + W / 2 + W / kI4Block);
    }
    alignas(16) float da[4 * NR];
    i4_tile_scales<MR, NR>(x, d, 0, g, da);
    i4_tile<MR, NR>(x, buf, da, 0, g, W / kI4Chunk, acc);
    offset += i4_super_bytes(W);
  }
  i4_tile_finish(a, offp, acc, y, 0, n0, N);
}

// Rows m0 .. m1 against outputs n0 .. n0 + NR, whose whole rows are widened into a panel ([G][NR]
// super-blocks) once, then read by each group of 4 rows.
template <int NR>
inline void i4_panel(const I4Rows& a, const I4Wide& x, const uint8_t* w, const c10::Half* off, int64_t stride,
                     float* y, int64_t N, int64_t n0, int64_t m0, int64_t m1, I4Scratch& s) {
  int16_t* panel = s.w.data;
  float *d = s.d.data(), *da = s.da.data(), *offp = s.off.data();
  i4_offsets_f32<NR>(off + n0 * a.B, a.B, offp);
  int64_t offset = 0;
  for (int64_t g = 0; g < a.G; ++g) {
    const int64_t W = i4_super_weights(a.K, g);
    for (int n = 0; n < NR; ++n) {
      const uint8_t* rec = w + (n0 + n) * stride + offset;
      i4_unpack(rec, W, panel + (g * NR + n) * kI4Wide);
      d[g * NR + n] = half_to_float(rec + W / 2 + W / kI4Block);
    }
    offset += i4_super_bytes(W);
  }
  // K in slices of kI4KSlice super-blocks, each slice through every group of rows, the groups'
  // accumulators kept in between: a slice's panel and a group's activations stay in L1.
  const int64_t full = a.K / kI4Super;
  const auto rows = [&](auto tag, int64_t m, int64_t g0, int64_t g1) {
    constexpr int MR = decltype(tag)::value;
    float* keep = s.acc.data() + (m - m0) * NR * 16;
    for (int64_t g = g0; g < g1; ++g) i4_tile_scales<MR, NR>(x, d + g * NR, m, g, da + g * 4 * NR);
    __m512 acc[MR][NR];
    if (g0 == 0) {
      i4_tile_zero(acc);
    } else {
      std::memcpy(acc, keep, sizeof(acc));
    }
    for (int64_t g = g0; g < std::min(g1, full); ++g) {   // whole super-blocks, then a shorter last one
      const int16_t* rows[MR];
#pragma GCC unroll 4
      for (int r = 0; r < MR; ++r) rows[r] = x.rows(m + r, g);
      i4_tile_step<MR, NR, 8>(rows, panel + g * NR * kI4Wide, da + g * 4 * NR, acc);
    }
    if (full < g1)
      i4_tile<MR, NR>(x, panel + full * NR * kI4Wide, da + full * 4 * NR, m, full, (a.K % kI4Super) / kI4Chunk, acc);
    if (g1 == a.G) {
      i4_tile_finish(a, offp, acc, y, m, n0, N);
    } else {
      std::memcpy(keep, acc, sizeof(acc));
    }
  };
  for (int64_t g0 = 0; g0 < a.G; g0 += kI4KSlice) {
    const int64_t g1 = std::min(a.G, g0 + kI4KSlice);
    int64_t m = m0;
    for (; m + kI4TileRows <= m1; m += kI4TileRows) rows(std::integral_constant<int, kI4TileRows>{}, m, g0, g1);
    switch (m1 - m) {
      case 3: rows(std::integral_constant<int, 3>{}, m, g0, g1); break;
      case 2: rows(std::integral_constant<int, 2>{}, m, g0, g1); break;
      case 1: rows(std::integral_constant<int, 1>{}, m, g0, g1); break;
      default: break;
    }
  }
}

template <int MR>
inline void i4_stream_outputs(const I4Rows& a, const I4Wide& x, const uint8_t* w, const c10::Half* off,
                              int64_t stride, float* y, int64_t N, int64_t b0, int64_t b1, I4Scratch& s) {
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t n0 = b * kI4TileOuts;
    if (n0 + kI4TileOuts <= N) {
      i4_stream<MR, kI4TileOuts>(a, x, w, off, stride, y, N, n0, s);
    } else {
      for (int64_t n = n0; n < N; ++n) i4_stream<MR, 1>(a, x, w, off, stride, y, N, n, s);
    }
  }
}

// y[M, N] for M >= 2 rows (a.K, quantized into a): output blocks of 3 split across the threads.
inline void i4_linear_rows(const I4Rows& a, const uint8_t* w, const c10::Half* off, float* y, int64_t M, int64_t N) {
  thread_local I4Wide wide;
  I4Wide& x = wide;                    // the caller's, named so that the workers read this one
  i4_widen(a, M, x);
  const int64_t stride = i4_row_bytes(a.K), blocks = (N + kI4TileOuts - 1) / kI4TileOuts;
  at::parallel_for(0, blocks, 16, [&](int64_t b0, int64_t b1) {
    thread_local I4Scratch scratch;
    I4Scratch& s = scratch;
    s.off.resize(kI4TileOuts * a.B);
    if (M <= kI4TileRows) {
      s.w.get(kI4TileOuts * kI4Wide);
      switch (M) {
        case 2: i4_stream_outputs<2>(a, x, w, off, stride, y, N, b0, b1, s); break;
        case 3: i4_stream_outputs<3>(a, x, w, off, stride, y, N, b0, b1, s); break;
        default: i4_stream_outputs<4>(a, x, w, off, stride, y, N, b0, b1, s); break;
      }
      return;
    }
    s.w.get(a.G * kI4TileOuts * kI4Wide);
    s.d.resize(a.G * kI4TileOuts);
    s.da.resize(a.G * 4 * kI4TileOuts);
    s.acc.resize(kI4RowBlock * kI4TileOuts * 16);
    for (int64_t m0 = 0; m0 < M; m0 += kI4RowBlock) {
      const int64_t m1 = std::min(M, m0 + kI4RowBlock);
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t n0 = b * kI4TileOuts;
        if (n0 + kI4TileOuts <= N) {
          i4_panel<kI4TileOuts>(a, x, w, off, stride, y, N, n0, m0, m1, s);
        } else {
          for (int64_t n = n0; n < N; ++n) i4_panel<1>(a, x, w, off, stride, y, N, n, m0, m1, s);
        }
      }
    }
  });
}

#endif

}  // namespace interlock_cpu
