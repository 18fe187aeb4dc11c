// sample_rows.cpp's per-row kernels (one variant per ISA path, zs_isa.h), shared with
// logprob_rows.cpp.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace zs_ops {

struct Kernels {
  void (*argmax)(const float* x, int64_t V, int64_t* out);  // the first index of the max
  void (*scale)(const float* x, float* a, int64_t V, float T, float* mx);  // a = x / T repaired
  void (*exp)(float* a, int64_t V, float mx, float lo, float* sum);  // a = exp(a - mx) where >= lo
  void (*blocks)(const float* e, int64_t V, float inv, float t, float* sums);  // sums of e*inv >= t
  void (*max_of)(const float* a, int64_t n, float* mx);
  void (*exp_sum)(const float* x, int64_t n, float mx, float* sum);  // sum exp(x - mx), -inf 0
  void (*collect)(const float* e, int64_t V, float inv, float floor, std::vector<float>* out);
};

Kernels kernels_for(int64_t isa);  // the variants of this (clamped) path

// The n largest of x[0:V] (n <= V) into ids / values, largest first, the lower index first
// on ties (heap: the caller's scratch).
void top_n(const Kernels& kn, const float* x, int64_t V, int64_t n, int64_t* ids, float* values,
           std::vector<std::pair<float, int64_t>>& heap);

}  // namespace zs_ops
