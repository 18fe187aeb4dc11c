// A step's penalties on the CPU in one op (penalties.py's kept-counts path, which issues ~12
// torch ops a step over the penalized rows): each penalized row's logits, in place, from the
// counts kept per slot (penalty_counts.py) and the row's token still in flight.
//
//   penalize_rows(logits [R, V'] f32 (rows a stride apart, V <= V'), rows [k] i64 (the
//                 penalized rows), entries [k] i64 (each one's entry of counts and seen),
//                 counts [E, V] f32, seen [E, V] bool (the prompt's tokens), pending [k] i64
//                 (-1, or the row of prev_tokens holding its token in flight), prev_tokens [P]
//                 i64, nums [k, 3] f32 (repetition, presence, frequency), flags) -> ()
//
// For a row, its counts c = counts[entry] + 1 at its token in flight, and each logit x:
//   (flags & 1) repetition, where rep != 1 and (seen or c > 0): x > 0 ? x / rep : x * rep
//   (flags & 2) presence:  x = x - presence * (c > 0)
//   (flags & 4) frequency: x = x - frequency * c
// each a float32 operation rounded as torch's is (no contraction: the baseline build has no
// FMA), so the logits are the torch path's bit for bit. The flags are the batch's (a term
// that no row of the batch has is not applied, as in the torch path).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstdint>

namespace zs_ops {

void penalize_rows(at::Tensor& logits, const at::Tensor& rows, const at::Tensor& entries, const at::Tensor& counts,
                   const at::Tensor& seen, const at::Tensor& pending, const at::Tensor& prev_tokens,
                   const at::Tensor& nums, int64_t flags) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.stride(1) == 1,
              "penalize_rows: logits must be float32 [R, V], rows contiguous");
  TORCH_CHECK(counts.dim() == 2 && counts.is_contiguous() && counts.scalar_type() == at::kFloat,
              "penalize_rows: counts must be a contiguous float32 [E, V]");
  const int64_t R = logits.size(0), V = counts.size(1), E = counts.size(0), ld = logits.stride(0);
  TORCH_CHECK(V <= logits.size(1), "penalize_rows: counts wider than the logits");
  TORCH_CHECK(seen.sizes() == counts.sizes() && seen.is_contiguous() && seen.scalar_type() == at::kBool,
              "penalize_rows: seen must be a contiguous bool [E, V]");
  const int64_t k = rows.numel();
  for (const at::Tensor* t : {&rows, &entries, &pending})
    TORCH_CHECK(t->dim() == 1 && t->size(0) == k && t->is_contiguous() && t->scalar_type() == at::kLong,
                "penalize_rows: rows, entries and pending must be contiguous int64 [k]");
  TORCH_CHECK(prev_tokens.dim() == 1 && prev_tokens.is_contiguous() && prev_tokens.scalar_type() == at::kLong,
              "penalize_rows: prev_tokens must be a contiguous int64 [P]");
  TORCH_CHECK(nums.dim() == 2 && nums.size(0) == k && nums.size(1) == 3 && nums.is_contiguous() &&
                  nums.scalar_type() == at::kFloat,
              "penalize_rows: nums must be a contiguous float32 [k, 3]");
  const int64_t *rw = rows.data_ptr<int64_t>(), *en = entries.data_ptr<int64_t>(), *pd = pending.data_ptr<int64_t>();
  const int64_t P = prev_tokens.numel();
  for (int64_t i = 0; i < k; ++i)
    TORCH_CHECK(rw[i] >= 0 && rw[i] < R && en[i] >= 0 && en[i] < E && pd[i] >= -1 && pd[i] < P,
                "penalize_rows: a row, entry or pending index out of range");
  if (k == 0) return;
  float* x = logits.data_ptr<float>();
  const float* cnt = counts.data_ptr<float>();
  const bool* sn = seen.data_ptr<bool>();
  const int64_t* prev = P ? prev_tokens.data_ptr<int64_t>() : nullptr;
  const float* nm = nums.data_ptr<float>();
  const bool rep_on = flags & 1, pres_on = flags & 2, freq_on = flags & 4;
  at::parallel_for(0, k, V >= 32768 ? 1 : 8, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      float* row = x + rw[i] * ld;
      const float* c = cnt + en[i] * V;
      const bool* s = sn + en[i] * V;
      const float rep = nm[i * 3], pres = nm[i * 3 + 1], freq = nm[i * 3 + 2];
      const bool repeat = rep_on && rep != 1.0f;
      const int64_t tok = pd[i] >= 0 ? prev[pd[i]] : -1;
      for (int64_t v = 0; v < V; ++v) {
        const float cv = v == tok ? c[v] + 1.0f : c[v];
        float xv = row[v];
        if (repeat && (s[v] || cv > 0.0f)) xv = xv > 0.0f ? xv / rep : xv * rep;
        if (pres_on) xv = xv - pres * (cv > 0.0f ? 1.0f : 0.0f);
        if (freq_on) xv = xv - freq * cv;
        row[v] = xv;
      }
    }
  });
}

}  // namespace zs_ops

TORCH_LIBRARY_FRAGMENT(zeroserve, lib) {
  lib.def(
      "penalize_rows(Tensor(a!) logits, Tensor rows, Tensor entries, Tensor counts, Tensor seen, Tensor pending, "
      "Tensor prev_tokens, Tensor nums, int flags) -> ()");
}

TORCH_LIBRARY_IMPL(zeroserve, CPU, lib) { lib.impl("penalize_rows", &zs_ops::penalize_rows); }
