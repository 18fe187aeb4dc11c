// Shared by the quantized-linear kernels (qgemm.cpp and its per-ISA headers): the block
// size, the weight forms and the problem a call describes. See qgemm.cpp for the math.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace zs_qgemm {

constexpr int64_t QK = 32;
enum Isa : int64_t { SCALAR = 0, AVX2 = 1, AVX512 = 2 };
enum Fmt : int64_t { Q4 = 0, Q8 = 1 };  // Q4: nibbles + d + m; Q8: int8 + d

struct Act {  // activations quantized per block of 32
  const int8_t* q;  // [M, K]
  const float* d;   // [M, nb]
  const float* s;   // [M, nb]: d * sum(q)
};

struct Weight {
  const uint8_t* q;  // [N, K/2] nibbles (Q4) or [N, K] int8 (Q8)
  const float* d;    // [N, nb]
  const float* m;    // [N, nb] (Q4 only)
  int64_t row_bytes;
};

struct Problem {
  Act x;
  Weight w;
  int64_t M, N, nb;
};

template <typename T>
inline void store(T* out, float v) {
  *out = static_cast<T>(v);
}

}  // namespace zs_qgemm
