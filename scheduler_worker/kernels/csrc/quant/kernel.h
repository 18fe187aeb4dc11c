// What every quantized-linear kernel shares, whatever its format or ISA: the signature of
// a kernel (GroupsFn: groups [g0, g1) of every activation row), the prefetch helpers and
// the small pieces of a tile. Each ISA's kernels live in arch/<isa>/, the portable
// reference in generic/; qlinear.cpp's table picks one per (format, ISA).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "../zs_isa.h"
#include "formats.h"

namespace zs_qgemm {

struct Out {  // the result [M, N], float32 or bfloat16 (the activations' dtype)
  void* p;
  bool bf16;
};

// f(out as T*), T the result's dtype: every kernel is a template on it.
template <typename F>
inline void with_out(Out o, F&& f) {
  if (o.bf16) f(static_cast<c10::BFloat16*>(o.p));
  else f(static_cast<float*>(o.p));
}

// Groups [g0, g1) of 16 output rows, for every one of the M activation rows.
using GroupsFn = void (*)(const Act& x, const Packed& w, int64_t M, Out out, int64_t g0, int64_t g1);
// One row of nb blocks of activations quantized: q, d, s as Act has them (x float32 or,
// with bf16, bfloat16).
using QuantizeFn = void (*)(const void* x, bool bf16, int64_t nb, int8_t* q, float* d, float* s);

// The kernels of each ISA: generic/gemm.cpp, arch/avx2/gemm.cpp, arch/avx512/gemm.cpp,
// arch/amx/gemm.cpp (each instantiates the formats it serves).
namespace generic {
extern const std::array<GroupsFn, NFMT> EVERY;  // every format's kernel, by its code
void quantize(const void* x, bool bf16, int64_t nb, int8_t* q, float* d, float* s);
}  // namespace generic
namespace avx2 {
template <int FMT>
void groups(const Act& x, const Packed& w, int64_t M, Out out, int64_t g0, int64_t g1);
void quantize(const void* x, bool bf16, int64_t nb, int8_t* q, float* d, float* s);
}  // namespace avx2
namespace avx512 {
template <int FMT>
void groups(const Act& x, const Packed& w, int64_t M, Out out, int64_t g0, int64_t g1);
}  // namespace avx512
namespace amx {
template <int FMT>
void groups(const Act& x, const Packed& w, int64_t M, Out out, int64_t g0, int64_t g1);
}  // namespace amx

// An ISA's gemm.cpp instantiates groups<FMT> for each format it has tiles for: the
// functions the table of qlinear.cpp names (its groups<FMT> names each format's tiles and
// refuses to compile for any other: no format falls into another's tiles).
#define ZS_INSTANTIATE_GROUPS(FMT) \
  template void groups<FMT>(const Act&, const Packed&, int64_t, Out, int64_t, int64_t);
// the ISAs with tiles for every format (AVX2, AVX-512)
#define ZS_INSTANTIATE_EVERY_FORMAT                                                          \
  ZS_INSTANTIATE_GROUPS(Q4) ZS_INSTANTIATE_GROUPS(Q8) ZS_INSTANTIATE_GROUPS(Q5)             \
  ZS_INSTANTIATE_GROUPS(Q4K) ZS_INSTANTIATE_GROUPS(Q5K) ZS_INSTANTIATE_GROUPS(Q6K)          \
  ZS_INSTANTIATE_GROUPS(Q50) ZS_INSTANTIATE_GROUPS(IQ4XS) ZS_INSTANTIATE_GROUPS(IQ4NL)
template <int FMT>
constexpr bool NO_TILES = false;  // static_assert(NO_TILES<FMT>) in an ISA's last `else`

inline int32_t load_i32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Software prefetch of a tile's weights PF_BLOCKS blocks on (past a group's last block: the
// next group's first, which the same thread reads next), by the first tile of rows of a
// group only: the later ones find the group's weights in cache. In the model a linear's
// weights come from DRAM, and from a few activation rows on the tiles alternate between
// waiting on them and computing: prefetched, the two overlap. Below 4 rows a tile streams
// the weights with little work between loads, the hardware prefetcher keeps up, and the
// prefetch instructions only cost (docs/benchmarks.md, "Fifth round"; the AVX2 tiles
// likewise on a quiet machine: "AVX2 K-quants at one stream").
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
// them (decode at 8 rows: one tile streams, one computes). The figures: docs/benchmarks.md,
// "Seventh round".
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

// xb[i]: activation row i0 + i's block b (32 int8), for the RM rows of a tile.
template <int RM>
inline void act_blocks(const int8_t* (&xb)[RM], const Act& x, int64_t i0, int64_t nb, int64_t b) {
  for (int i = 0; i < RM; ++i) xb[i] = x.q + (i0 + i) * nb * QK + b * QK;
}

template <typename T>
inline void store(T* out, float v) {
  *out = static_cast<T>(v);
}

template <int RM>
using Rows = std::integral_constant<int, RM>;

}  // namespace zs_qgemm
