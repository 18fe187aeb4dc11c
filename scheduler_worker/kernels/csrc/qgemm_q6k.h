// GGUF Q6_K weights (fmt 5 of qlinear) times activations quantized to 8 bits per block of
// 32 (quantize_act), in the interleaved 16-row groups of the other formats (qgemm_common.h,
// qgemm_kquant.h). Per 16 inputs ("piece") w = d * sc * (q - 32), q a 6-bit unsigned value,
// sc an int8 sub-scale, d the float16 super-scale of 256 inputs. Only bits move at load
// (scheduler_worker/quant/q6k.py: pack), no value changes.
//
// Layout, per group of 16 output rows (the last padded with zero scales) and super-block
// of 256 inputs, 3328 bytes of qs:
//   [256 bytes] sc: int8 [16 pieces][16 rows]
//   then, per sub-block of 32 inputs (pieces 2s and 2s + 1), "SB", 384 bytes:
//   [256 bytes] the nibble plane, exactly the 4-bit layout of qgemm_common.h: 64-byte
//               register k (0..3), byte 4r + j holds the low 4 bits of q for input 4k + j
//               of row r in its low nibble (the sub-block's first piece) and for input
//               16 + 4k + j in its high nibble (the second piece)
//   [ 64 bytes] h0: byte 4r + j holds in bits 2k, 2k + 1 the top two bits of q for input
//               4k + j of row r (k = 0..3): the first piece's
//   [ 64 bytes] h1: the same for input 16 + 4k + j: the second piece's
// and d float16 [groups, super-blocks, 16]: 16 x 210 bytes per group and super-block, the
// file's bytes.
//
// The integer dot of a piece, sum (q - 32) x, is formed as sum q x (q unsigned: the VNNI
// dpbusd / AVX2 maddubs operand) plus -32 sum x, the activation piece sums the entry works
// out once per call (Q6Act::off), so the accumulators start at it. Per sub-block and row,
// t = dot0 * (d sc0) + dot1 * (d sc1) in float32 (d sc exact: 11-bit x 8-bit mantissas),
// and out += t * dx, dx the activation block's scale.
#pragma once

#include <ATen/ATen.h>

#include "qgemm_common.h"

namespace zs_qgemm {

constexpr int64_t Q6K = 5;         // qlinear's fmt code
constexpr int64_t QK_K = 256;      // inputs per super-block
constexpr int64_t Q6_SB = 384;     // bytes per group and sub-block of 32 inputs
constexpr int64_t Q6_UB = 256 + 8 * Q6_SB;  // bytes per group and super-block

struct Q6Packed {
  const uint8_t* q;    // [groups, nsb, Q6_UB]
  const c10::Half* d;  // [groups, nsb, 16]
  int64_t nsb;         // super-blocks per row (K / 256)
  int64_t N;           // output rows
};

struct Q6Act {         // activations quantized per block of 32 (quantize_act)
  const int8_t* q;     // [M, K]
  const float* d;      // [M, K / 32]
  const int32_t* off;  // [M, K / 16]: -32 * the sum of each piece of 16 q
  bool prefetch;       // as Act's
};

// Sub-block b (of 32 inputs, counted along the row) of group g, and its two pieces' int8
// scales (16 rows each, the second piece's at + 16).
inline const uint8_t* q6_sub(const Q6Packed& w, int64_t g, int64_t b) {
  return w.q + (g * w.nsb + b / 8) * Q6_UB + 256 + (b % 8) * Q6_SB;
}
inline const int8_t* q6_sc(const Q6Packed& w, int64_t g, int64_t b) {
  return reinterpret_cast<const int8_t*>(w.q + (g * w.nsb + b / 8) * Q6_UB + (b % 8) * 2 * GR);
}
inline const c10::Half* q6_d(const Q6Packed& w, int64_t g, int64_t b) {
  return w.d + (g * w.nsb + b / 8) * GR;
}

// x [M, K] float32/bfloat16, K % 256 == 0, weight packed as above -> [M, n] (x's dtype)
at::Tensor qlinear_q6k(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d, int64_t n, int64_t isa);

}  // namespace zs_qgemm
