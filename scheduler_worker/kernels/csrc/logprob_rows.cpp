// The logprobs rows of a step on the CPU: two passes and a top-n heap a row, where torch's
// log_softmax writes [k, V] and topk reads it again.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "sample_rows.h"

#include <cmath>
#include <tuple>
#include <utility>
#include <vector>

namespace zs_ops {

// The logprobs rows of a step (Sampler._logprobs): raw [k, V] float32, the rows' raw logits;
// tokens [k] int64, each row's sampled token; n, the top logprobs wanted (0 <= n <= V).
// Returns (the sampled tokens' logprobs [k] float32, the top-n logprobs [k, n] float32, their
// ids [k, n] int64): log_softmax as x - max - log(sum exp(x - max)), as torch's, top-n by
// value (the lower id first on ties).
std::tuple<at::Tensor, at::Tensor, at::Tensor> logprob_rows(const at::Tensor& raw, const at::Tensor& tokens,
                                                           int64_t n, int64_t isa) {
  TORCH_CHECK(raw.dim() == 2 && raw.is_contiguous() && raw.scalar_type() == at::kFloat,
              "logprob_rows: raw must be a contiguous float32 [k, V]");
  const int64_t k = raw.size(0), V = raw.size(1);
  TORCH_CHECK(tokens.dim() == 1 && tokens.size(0) == k && tokens.scalar_type() == at::kLong && tokens.is_contiguous(),
              "logprob_rows: tokens must be a contiguous int64 [k]");
  TORCH_CHECK(n >= 0 && n <= V, "logprob_rows: n must be in [0, V]");
  const int64_t* tok = tokens.data_ptr<int64_t>();
  for (int64_t r = 0; r < k; ++r) TORCH_CHECK(tok[r] >= 0 && tok[r] < V, "logprob_rows: token out of range");
  at::Tensor sampled = at::empty({k}, raw.options()), top = at::empty({k, n}, raw.options());
  at::Tensor ids = at::empty({k, n}, tokens.options());
  const float* x = raw.data_ptr<float>();
  float *sp = sampled.data_ptr<float>(), *tp = top.data_ptr<float>();
  int64_t* ip = ids.data_ptr<int64_t>();
  const Kernels kn = kernels_for(isa);
  at::parallel_for(0, k, 1, [&](int64_t r0, int64_t r1) {
    thread_local std::vector<std::pair<float, int64_t>> heap;
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = x + r * V;
      float mx, sum;
      kn.max_of(row, V, &mx);
      kn.exp_sum(row, V, mx, &sum);
      const float lse = std::log(sum);
      sp[r] = row[tok[r]] - mx - lse;
      if (n == 0) continue;
      top_n(kn, row, V, n, ip + r * n, tp + r * n, heap);
      for (int64_t j = 0; j < n; ++j) tp[r * n + j] = tp[r * n + j] - mx - lse;
    }
  });
  return {sampled, top, ids};
}

}  // namespace zs_ops

TORCH_LIBRARY_FRAGMENT(zeroserve, lib) {
  lib.def("logprob_rows(Tensor raw, Tensor tokens, int n, int isa) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(zeroserve, CPU, lib) { lib.impl("logprob_rows", &zs_ops::logprob_rows); }
