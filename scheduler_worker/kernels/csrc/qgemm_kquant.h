// The 5-bit and K-quant formats of the quantized linears (GGUF Q5_0 / Q5_1, Q4_K, Q5_K):
// their layouts and the entry qgemm.cpp's qlinear hands them to (qgemm_kquant.cpp).
//
// Values are kept as the file has them; only bits move. Every format is, per block of 32
// inputs (a K-quant "sub-block"), w = dw * q + mw with q an unsigned 4- or 5-bit integer:
//   fmt 2 "q5"  (Q5_1): dw = d, mw = m per block, float16
//   fmt 6 "q50" (Q5_0): dw = d, mw = -16 d: no m is stored, and the epilogue is one
//              fused multiply-subtract d * (dx * dot - 16 s) (one FMA and one load fewer)
//   fmt 3 "q4k" (Q4_K), fmt 4 "q5k" (Q5_K): super-blocks of 256 inputs (8 sub-blocks);
//              dw = d * sc, mw = m * mn with d and m (= -dmin) float16 per super-block and
//              sc, mn the 6-bit sub-scales/mins kept as uint8; the products are formed in
//              float32 in the kernel, where they are exact (11-bit x 6-bit mantissas).
// Activations stay int8 per block of 32 (qgemm.cpp's quantize_act, llama.cpp's Q8_1
// recipe), finer than the Q8_K super-blocks of 256 llama.cpp pairs the K-quants with.
//
// Layout, in the interleaved 16-row groups of qgemm_common.h (the last group padded with
// zero weights). One sub-block of a group, "SB", is
//   [256 bytes] the nibble plane: exactly the 4-bit layout of qgemm_common.h (64-byte
//               register k, byte 4r + j = the nibble byte 4k + j of row r: low nibble
//               input 4k + j, high nibble input 16 + 4k + j)
//   [ 64 bytes] 5-bit formats only, the high-bit plane: byte 4r + j holds, in bit 2k, the
//               fifth bit of input 4k + j of row r and, in bit 2k + 1, that of input
//               16 + 4k + j (k = 0..3): the bits the kernel ORs into register k's nibbles.
// qs uint8 per group:
//   q5, q50: nb blocks, each one SB (320 bytes)
//   q4k:  K/256 super-blocks, each: sc [8 sub-blocks][16 rows] uint8, mn [8][16] uint8,
//   q5k:  then the 8 sub-blocks' SB (256 or 320 bytes each): 2304 / 2816 bytes
// d, m float16 [groups, units, 16] (units = blocks for q5 / q50, super-blocks for q4k /
// q5k; q50 has no m).
#pragma once

#include <ATen/ATen.h>

namespace zs_qgemm {

enum KFmt : int64_t { Q5 = 2, Q4K = 3, Q5K = 4, Q50 = 6 };  // 5: Q6_K (qgemm_q6k.h)

inline bool is_kquant_fmt(int64_t fmt) { return fmt == Q5 || fmt == Q4K || fmt == Q5K || fmt == Q50; }

at::Tensor qlinear_kquant(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d,
                          const c10::optional<at::Tensor>& m, int64_t fmt, int64_t n, int64_t isa);

}  // namespace zs_qgemm
