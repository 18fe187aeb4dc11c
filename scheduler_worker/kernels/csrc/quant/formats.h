// The one table of the quantized linears' weight formats (the `fmt` code of qlinear): each
// format's row (FORMAT_ROWS), read by every kernel, and the structs they share. The Python
// side's rows (scheduler_worker/quant/formats.py FORMATS) are checked against this enum
// by tests/scheduler_worker/test_format_codes.py. Which ISA runs which format is the
// other table, in qlinear.cpp.
//
// Every format is, per piece of 32 (or 16) inputs, w = dw * v + mw with v an integer the
// kernels dot with the 8-bit activations, its values kept as the GGUF file has them (only
// bits move at load: scheduler_worker/quant/). A row says
//   bits      the stored q: 4 (a nibble plane), 5 or 6 (plus 1 or 2 high-bit planes), 8
//   offset    v = q - offset (Q8_0: bytes stored + 128; Q5_0: q - 16; Q6_K: q - 32), or
//   codebook  v = codebook[q] (IQ4_XS, IQ4_NL: llama.cpp's kvalues_iq4nl)
//   unit      d (and m) per block of 32, or per super-block of 256 (8 blocks)
//   scale     dw = d, d * sc (sc uint8 per block) or d * sc (int8 per piece)
//   min       mw = 0, m, or m * mn (mn uint8 per block)
//   piece     inputs per dw: 32, or 16 (Q6_K: the activations' sums per 16, Act::off)
//
// Layout: output rows in groups of 16 (GR), the last padded with zero weights; per group
// and block of 32 inputs, the 16 rows' bytes interleaved 4 at a time, so 64-byte register
// k holds bytes 4k..4k+3 of rows 0..15 in turn. One block of a group (64 * bits bytes):
//   [256 bytes] the nibble plane (bits 4, 5, 6): register k, byte 4r + j holds input
//               4k + j of row r in its low nibble and input 16 + 4k + j in its high one
//   [512 bytes] bits 8 instead: 8 registers of one byte an input
//   [ 64 bytes] bits 5: the high-bit plane, byte 4r + j holding in bit 2k the fifth bit of
//               input 4k + j of row r and in bit 2k + 1 that of input 16 + 4k + j
//   [128 bytes] bits 6: h0 then h1, byte 4r + j holding in bits 2k, 2k + 1 the top two
//               bits of input 4k + j (h0: the first piece's) or 16 + 4k + j (h1)
// A group's "unit" is a block, or a super-block: its head (the blocks' scale bytes, one
// per row: sc [8 blocks][16 rows] then mn [8][16] where min is M_MN; int8 per piece:
// [16 pieces][16 rows]; int8 per block: [8][16]), then its 8 blocks. d (and m) are
// float16 [groups, units, 16], one per row; or, where a format has m, d and m interleaved
// unit by unit (Packed::ds = 32, m = d + 16): one stream of scales instead of two, which a
// 1-row tile streams faster (docs/benchmarks.md, "AVX2 Q5_1 at one row, ninth session").
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <array>
#include <cstdint>
#include <utility>

namespace zs_qgemm {

constexpr int64_t QK = 32;    // inputs per block (and per block of quantized activations)
constexpr int64_t GR = 16;    // output rows per group
constexpr int64_t QK_K = 256;  // inputs per super-block

enum Fmt : int64_t { Q4 = 0, Q8 = 1, Q5 = 2, Q4K = 3, Q5K = 4, Q6K = 5, Q50 = 6, IQ4XS = 7, IQ4NL = 8 };
constexpr int64_t NFMT = 9;

// llama.cpp's kvalues_iq4nl (ggml-common.h): IQ4_XS's and IQ4_NL's nibble -> value
inline constexpr int8_t KVALUES_IQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                             1,    13,   25,  38,  53,  69,  89,  113};

enum class Scale { D, D_SC_U8, D_SC_I8 };  // dw = d, d * uint8 sc per block, d * int8 sc per piece
enum class Min { NONE, M, M_MN };          // mw = 0, m, m * uint8 mn per block

struct FormatRow {
  const char* name;
  int64_t bits;                      // of the stored q
  int64_t offset = 0;                // v = q - offset
  const int8_t* codebook = nullptr;  // else v = codebook[q] (a 4-bit q)
  int64_t unit = QK;                 // inputs per d (and m): QK or QK_K
  Scale scale = Scale::D;
  Min min = Min::NONE;
  int64_t piece = QK;  // inputs per dw
};

inline constexpr FormatRow FORMAT_ROWS[NFMT] = {
    {.name = "Q4_0/Q4_1", .bits = 4, .min = Min::M},  // Q4_0: m = -8 d
    {.name = "Q8_0", .bits = 8, .offset = 128},
    {.name = "Q5_1", .bits = 5, .min = Min::M},
    {.name = "Q4_K", .bits = 4, .unit = QK_K, .scale = Scale::D_SC_U8, .min = Min::M_MN},
    {.name = "Q5_K", .bits = 5, .unit = QK_K, .scale = Scale::D_SC_U8, .min = Min::M_MN},
    {.name = "Q6_K", .bits = 6, .offset = 32, .unit = QK_K, .scale = Scale::D_SC_I8, .piece = 16},
    {.name = "Q5_0", .bits = 5, .offset = 16},
    {.name = "IQ4_XS", .bits = 4, .codebook = KVALUES_IQ4NL, .unit = QK_K, .scale = Scale::D_SC_I8},
    {.name = "IQ4_NL", .bits = 4, .codebook = KVALUES_IQ4NL},
};

// What the kernels derive from a row.
template <int FMT>
struct Layout {
  static constexpr FormatRow R = FORMAT_ROWS[FMT];
  static constexpr bool SUPER = R.unit == QK_K;          // units of 256 inputs
  static constexpr bool HI = R.bits == 5;                // a high-bit plane
  static constexpr bool M = R.min != Min::NONE;          // a stored m
  static constexpr bool PIECES = R.piece == 16;          // the activations' sums per 16 (Act::off)
  static constexpr int64_t SBB = 64 * R.bits;            // bytes per group and block
  static constexpr int64_t UK = R.unit / QK;             // blocks per unit
  static constexpr int64_t SC_BYTES = R.scale == Scale::D ? 0 : GR * QK / R.piece;  // per block
  static constexpr int64_t HEAD = UK * SC_BYTES * (R.min == Min::M_MN ? 2 : 1);      // per unit
  static constexpr int64_t UB = HEAD + UK * SBB;         // bytes per group and unit
  static_assert(R.codebook == nullptr || R.bits == 4, "a codebook is indexed by a nibble");
  static_assert(SUPER || HEAD == 0, "a block's own scales are d (and m)");
};

struct FormatInfo {  // what the entry checks of a weight, per format
  const char* name;
  int64_t unit;        // inputs per unit of d (and m)
  int64_t unit_bytes;  // packed bytes per group and unit
  bool m;              // m stored beside d
  bool pieces;         // activations need per-16 sums
};

template <int FMT>
constexpr FormatInfo info() {
  using L = Layout<FMT>;
  return {L::R.name, L::R.unit, L::UB, L::M, L::PIECES};
}

template <int... F>
constexpr auto infos(std::integer_sequence<int, F...>) {
  return std::array<FormatInfo, NFMT>{info<F>()...};
}
inline constexpr std::array<FormatInfo, NFMT> FORMATS = infos(std::make_integer_sequence<int, NFMT>{});

struct Packed {  // a weight in the layout above
  const uint8_t* q;    // [groups, units, unit bytes]
  const c10::Half* d;  // [groups, units, 16], a unit's 16 ds apart
  const c10::Half* m;  // the same shape and ds; null where the format stores none
  int64_t nb;          // blocks of 32 per row (K / 32)
  int64_t N;           // output rows (columns of the result)
  int64_t ds = GR;     // halves from a unit's scales to the next unit's: 16, or 32 (d, m interleaved)
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
// scale bytes for the block (sc, and mn at + 8 * 16 where min is M_MN; int8 per piece: the
// two pieces', the second's at + 16).
template <int FMT>
inline const uint8_t* sub_block(const Packed& w, int64_t g, int64_t b) {
  using L = Layout<FMT>;
  if constexpr (L::SUPER) return w.q + (g * (w.nb / 8) + b / 8) * L::UB + L::HEAD + (b % 8) * L::SBB;
  else return w.q + (g * w.nb + b) * L::SBB;
}
// Halves from a unit's scales to the next's: Packed::ds where the format has m, else 16
// (a constant, so the kernels of formats without m compile as before).
template <int FMT>
inline int64_t scale_stride(const Packed& w) {
  return Layout<FMT>::M ? w.ds : GR;
}
template <int FMT>
inline int64_t unit_of(const Packed& w, int64_t g, int64_t b) {
  return g * (w.nb / Layout<FMT>::UK) + b / Layout<FMT>::UK;
}
template <int FMT>
inline const uint8_t* block_scales(const Packed& w, int64_t g, int64_t b) {
  return w.q + unit_of<FMT>(w, g, b) * Layout<FMT>::UB + (b % 8) * Layout<FMT>::SC_BYTES;
}
// Q6K: block b's two pieces' int8 scales (16 rows each), and its super-block's d.
inline const int8_t* q6_sc(const Packed& w, int64_t g, int64_t b) {
  return reinterpret_cast<const int8_t*>(block_scales<Q6K>(w, g, b));
}
inline const c10::Half* q6_d(const Packed& w, int64_t g, int64_t b) { return w.d + unit_of<Q6K>(w, g, b) * GR; }

}  // namespace zs_qgemm
