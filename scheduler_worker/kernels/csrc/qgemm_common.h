// Shared by the quantized-linear kernels (qgemm.cpp and its per-ISA headers): the block
// size, the weight forms and the weight layout. See qgemm.cpp for the math.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "zs_isa.h"

namespace zs_qgemm {

constexpr int64_t QK = 32;
enum Fmt : int64_t { Q4 = 0, Q8 = 1 };  // Q4: nibbles + d + m; Q8: int8 + d

struct Act {  // activations quantized per block of 32
  const int8_t* q;  // [M, K]
  const float* d;   // [M, nb]
  const float* s;   // [M, nb]: d * sum(q)
  bool prefetch;    // prefetch_weights(M): the first row tile of a group prefetches
};

// Weights in the kernels' layout (scheduler_worker/quant/formats.py: pack_blocks): output
// rows in groups of 16, the last padded with zero weights; per group and block of 32
// inputs, the 16 rows' bytes interleaved 4 at a time, so 64-byte register k holds bytes
// 4k..4k+3 of rows 0..15 in turn:
//   4-bit: 4 registers (256 bytes) of GGUF's nibble bytes (the low nibble of byte j is
//          input j, the high one input 16 + j)
//   8-bit: 8 registers (512 bytes), each value stored + 128 (as an unsigned byte)
// and per group and block, 16 float16 values of d (and of m), one per row.
constexpr int64_t GR = 16;  // output rows per group

template <int FMT>
constexpr int64_t group_block_bytes() { return FMT == Q8 ? 512 : 256; }

struct Packed {
  const uint8_t* q;  // [groups, nb, group_block_bytes]
  const c10::Half* d;  // [groups, nb, 16]
  const c10::Half* m;  // [groups, nb, 16] (4-bit)
  int64_t nb;        // blocks per row (K / 32)
  int64_t N;         // output rows (columns of the result)
};

inline int32_t load_i32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Software prefetch of a tile's weights PF_BLOCKS blocks on (past a group's last block: the
// next group's first, which the same thread reads next), by the first tile of rows of a
// group only: the later ones find the group's weights in cache. In the model a linear's
// weights come from DRAM, and from a few activation rows on the tiles alternate between
// waiting on them and computing: prefetched, the two overlap (SmolLM2 Q4_K_M decode step in
// process, avx512: 8 rows 11.7-14.5 -> 9.8-10.6 ms, 32 rows 33.8-35.0 -> 26.5-27.2 ms).
// Below 4 rows a tile streams the weights with little work between loads, the hardware
// prefetcher keeps up, and the prefetch instructions only cost (Gemma 3's 262k-row Q8_0
// output head at 1 row: 12.1-13.8 ms a step without, 12.1-15.4 with).
constexpr int64_t PF_BLOCKS = 8;
inline bool prefetch_weights(int64_t M) { return M >= 4; }

template <int64_t BYTES>
inline void prefetch_block_ahead(const uint8_t* block) {
  for (int64_t off = 0; off < BYTES; off += 64)
    _mm_prefetch(reinterpret_cast<const char*>(block + PF_BLOCKS * BYTES + off), _MM_HINT_T0);
}

// The weights of the groups a thread computes next (a group's bytes are contiguous), asked
// for into L2 by the last tile of rows of the groups in hand, a share per block. Where a
// group takes more than one tile of rows, only its first tile streams the weights from
// DRAM; the later tiles compute from cache, and without this the memory sat idle through
// them (decode at 8 rows: one tile streams, one computes). Decode steps in process,
// avx512 (Zen 4, 2 threads), steps alternating without/with: SmolLM2 Q6_K 8 rows
// 12.6 -> 10.2 ms, 32 rows 30.8 -> 27.7; Gemma 3 Q4_K_M 20.8 -> 16.5, 55.9 -> 51.6; SmolLM2
// Q4_K_M 9.9 -> 9.3, 28.3 -> 27.6 (its Q5_0 tiles compute more per byte). The AVX2 path
// (emulated on the same CPU), Q6_K: 18.8 -> 18.3, 62.3 -> 61.3.
struct Ahead {
  const uint8_t* q = nullptr;  // the next groups' first byte; null: nothing to ask for
  int64_t per_block = 0;       // bytes per block of the tile in hand (a multiple of 64)
  inline void fetch(int64_t b) const {
    if (q == nullptr) return;
    for (int64_t off = b * per_block, end = off + per_block; off < end; off += 64)
      _mm_prefetch(reinterpret_cast<const char*>(q + off), _MM_HINT_T1);
  }
};

// Ahead of groups [next, next + n) of a weight of `group_bytes` per group, over nb blocks.
inline Ahead ahead_of(const uint8_t* q, int64_t group_bytes, int64_t next, int64_t n, int64_t nb) {
  if (n <= 0) return {};
  return {q + next * group_bytes, ((n * group_bytes + nb - 1) / nb + 63) / 64 * 64};
}

// xb[i]: activation row i0 + i's block b (32 int8), for the RM rows of a tile (A: Act, or
// any activations with the same int8 rows `q`).
template <int RM, typename A>
inline void act_blocks(const int8_t* (&xb)[RM], const A& x, int64_t i0, int64_t nb, int64_t b) {
  for (int i = 0; i < RM; ++i) xb[i] = x.q + (i0 + i) * nb * QK + b * QK;
}

template <typename T>
inline void store(T* out, float v) {
  *out = static_cast<T>(v);
}

template <int RM>
using Rows = std::integral_constant<int, RM>;

// Groups [g0, g1) of a GEMM below AVX-512, the same loop for every format: on AVX2
// (`avx2`) tiles of 2 activation rows then 1, `tile(Rows<RM>{}, i0, g, ahead)`, the
// group's last tile asking for `ahead_of_group(g)`; else the portable path, one
// `dot(i, n)` an output.
template <typename T, typename Tile, typename Dot, typename AheadOf>
inline void gemm_below_avx512(int64_t M, int64_t N, T* out, int64_t g0, int64_t g1, bool avx2,
                              Tile tile, Dot dot, AheadOf ahead_of_group) {
  for (int64_t g = g0; g < g1; ++g) {
    if (avx2) {
      const Ahead ahead = ahead_of_group(g);
      int64_t i = 0;
      for (; i + 2 <= M; i += 2) tile(Rows<2>{}, i, g, i + 2 == M ? ahead : Ahead{});
      if (i < M) tile(Rows<1>{}, i, g, ahead);
      continue;
    }
    for (int64_t n = g * GR; n < std::min(N, (g + 1) * GR); ++n)
      for (int64_t i = 0; i < M; ++i) store(out + i * N + n, dot(i, n));
  }
}

}  // namespace zs_qgemm
