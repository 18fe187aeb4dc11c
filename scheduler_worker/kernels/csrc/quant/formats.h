// The one table of the quantized linears' weight formats (the `fmt` code of qlinear): each
// format's code, its unit of scales and its bytes, and the structs every kernel reads.
// The Python side's codes (scheduler_worker/quant/formats.py FMT_CODES) are checked
// against this enum by tests/scheduler_worker/test_format_codes.py. Which ISA runs which
// format is the other table, in qlinear.cpp.
//
// Every format is, per block of 32 inputs, w = dw * q + mw, its values kept as the GGUF
// file has them (only bits move at load: scheduler_worker/quant/):
//   Q4  (Q4_0, Q4_1):  q 4-bit unsigned, dw = d, mw = m per block (Q4_0: m = -8 d)
//   Q8  (Q8_0):        q int8 stored + 128, dw = d, no m
//   Q5  (Q5_1):        q 5-bit unsigned, dw = d, mw = m per block
//   Q50 (Q5_0):        as Q5 with no m stored: mw = -16 d
//   Q4K, Q5K:          super-blocks of 256 inputs (8 blocks): dw = d * sc, mw = m * mn, d and
//                      m (= -dmin) float16 per super-block, sc, mn 6-bit uint8 per block
//   Q6K:               per 16 inputs ("piece") w = d * sc * (q - 32), q 6-bit unsigned, sc
//                      int8 per piece, d float16 per super-block of 256
//
// Layout: output rows in groups of 16 (GR), the last padded with zero weights; per group
// and block of 32 inputs, the 16 rows' bytes interleaved 4 at a time, so 64-byte register
// k holds bytes 4k..4k+3 of rows 0..15 in turn. One block of a group ("SB"):
//   [256 bytes] the nibble plane (Q4, Q5*, Q4K, Q6K): register k, byte 4r + j holds input
//               4k + j of row r in its low nibble and input 16 + 4k + j in its high one
//   [512 bytes] Q8 instead: 8 registers of one byte an input (+ 128, unsigned)
//   [ 64 bytes] 5-bit formats: the high-bit plane, byte 4r + j holding in bit 2k the fifth
//               bit of input 4k + j of row r and in bit 2k + 1 that of input 16 + 4k + j
//   [128 bytes] Q6K: h0 then h1, byte 4r + j holding in bits 2k, 2k + 1 the top two bits
//               of input 4k + j (h0: the first piece's) or 16 + 4k + j (h1)
// A group's "unit" is a block (Q4, Q8, Q5, Q50) or a super-block (Q4K, Q5K: the scale
// bytes sc [8 blocks][16 rows], mn [8][16], then the 8 blocks; Q6K: sc int8 [16 pieces][16
// rows], then the 8 blocks). d (and m) are float16 [groups, units, 16], one per row.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

namespace zs_qgemm {

constexpr int64_t QK = 32;    // inputs per block (and per block of quantized activations)
constexpr int64_t GR = 16;    // output rows per group
constexpr int64_t QK_K = 256;  // inputs per super-block

enum Fmt : int64_t { Q4 = 0, Q8 = 1, Q5 = 2, Q4K = 3, Q5K = 4, Q6K = 5, Q50 = 6 };
constexpr int64_t NFMT = 7;

template <int FMT>
struct Layout {
  static constexpr bool SUPER = FMT == Q4K || FMT == Q5K || FMT == Q6K;  // units of 256 inputs
  static constexpr bool HI = FMT == Q5 || FMT == Q50 || FMT == Q5K;      // a high-bit plane
  static constexpr bool M = FMT == Q4 || FMT == Q5 || FMT == Q4K || FMT == Q5K;  // a stored m
  static constexpr bool PIECES = FMT == Q6K;  // the activations' sums per 16 (Act::off)
  static constexpr int64_t SBB = FMT == Q8 ? 512 : FMT == Q6K ? 384 : HI ? 320 : 256;  // bytes per block
  static constexpr int64_t UK = SUPER ? 8 : 1;  // blocks per unit
  static constexpr int64_t UB = SUPER ? 256 + 8 * SBB : SBB;  // bytes per group and unit
};

struct FormatInfo {  // what the entry checks of a weight, per format
  const char* name;
  int64_t unit;        // inputs per unit of d (and m)
  int64_t unit_bytes;  // packed bytes per group and unit
  bool m;              // m stored beside d
  bool pieces;         // activations need per-16 sums
};

template <int FMT>
constexpr FormatInfo info(const char* name) {
  using L = Layout<FMT>;
  return {name, L::UK * 32, L::UB, L::M, L::PIECES};
}

inline constexpr FormatInfo FORMATS[NFMT] = {
    info<Q4>("Q4_0/Q4_1"), info<Q8>("Q8_0"), info<Q5>("Q5_1"),  info<Q4K>("Q4_K"),
    info<Q5K>("Q5_K"),     info<Q6K>("Q6_K"), info<Q50>("Q5_0"),
};

struct Packed {  // a weight in the layout above
  const uint8_t* q;    // [groups, units, unit bytes]
  const c10::Half* d;  // [groups, units, 16]
  const c10::Half* m;  // [groups, units, 16]; null where the format stores none
  int64_t nb;          // blocks of 32 per row (K / 32)
  int64_t N;           // output rows (columns of the result)
};

struct Act {  // activations quantized per block of 32 (qlinear.cpp: quantize_act)
  const int8_t* q;     // [M, K]
  const float* d;      // [M, nb]
  const float* s;      // [M, nb]: d * sum(q)
  const int32_t* off;  // [M, K / 16]: -32 * the sum of each piece of 16 q (Q6K only)
  bool prefetch;       // prefetch_weights(M): the first row tile of a group prefetches
};

template <int FMT>
constexpr int64_t group_bytes(int64_t nb) {  // one group's packed bytes
  return nb / Layout<FMT>::UK * Layout<FMT>::UB;
}
// Block b (of 32 inputs, counted along the row) of group g; its unit; a super-block's
// scale bytes for the block (Q4K/Q5K: sc, mn at + 128; Q6K: the two pieces' int8 sc, the
// second's at + 16).
template <int FMT>
inline const uint8_t* sub_block(const Packed& w, int64_t g, int64_t b) {
  using L = Layout<FMT>;
  if constexpr (L::SUPER) return w.q + (g * (w.nb / 8) + b / 8) * L::UB + 256 + (b % 8) * L::SBB;
  else return w.q + (g * w.nb + b) * L::SBB;
}
template <int FMT>
inline int64_t unit_of(const Packed& w, int64_t g, int64_t b) {
  return g * (w.nb / Layout<FMT>::UK) + b / Layout<FMT>::UK;
}
template <int FMT>
inline const uint8_t* block_scales(const Packed& w, int64_t g, int64_t b) {
  return w.q + unit_of<FMT>(w, g, b) * Layout<FMT>::UB + (b % 8) * (FMT == Q6K ? 2 * GR : GR);
}
// Q6K: block b's two pieces' int8 scales (16 rows each), and its super-block's d.
inline const int8_t* q6_sc(const Packed& w, int64_t g, int64_t b) {
  return reinterpret_cast<const int8_t*>(block_scales<Q6K>(w, g, b));
}
inline const c10::Half* q6_d(const Packed& w, int64_t g, int64_t b) { return w.d + unit_of<Q6K>(w, g, b) * GR; }

}  // namespace zs_qgemm
