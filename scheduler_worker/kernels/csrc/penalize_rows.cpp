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
//   (flags & 8) commit: the token in flight stays counted, counts[entry] += 1 there (the
//               host then counts it at its placeholder: PenaltyCounts.gather's commit;
//               the rows' entries are distinct then, so no two rows write one entry)
// each a float32 operation rounded as torch's is (no contraction: the baseline build has no
// FMA), so the logits are the torch path's bit for bit. The flags are the batch's (a term
// that no row of the batch has is not applied, as in the torch path). A row is one SSE2
// loop for its terms, its token in flight redone after it.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <emmintrin.h>

#include <cstdint>
#include <cstring>

namespace zs_ops {
namespace {

// One row's logits x [V] from its counts c and seen s, the terms R(epetition), P(resence),
// F(requency) chosen at compile time, four logits at a time in SSE2 (the baseline's: the
// compiler keeps a branch on the logit's sign, the division being able to trap), both of a
// logit's repetition results computed, then selected.
template <bool R, bool P, bool F>
void penalize_row(float* x, const float* c, const bool* s, int64_t V, float rep, float pres, float freq) {
  const __m128 vrep = _mm_set1_ps(rep), vpres = _mm_set1_ps(pres), vfreq = _mm_set1_ps(freq);
  const __m128 zero = _mm_setzero_ps(), one = _mm_set1_ps(1.0f);
  int64_t v = 0;
  for (; v + 4 <= V; v += 4) {
    const __m128 cv = _mm_loadu_ps(c + v), counted = _mm_cmpgt_ps(cv, zero);
    __m128 xv = _mm_loadu_ps(x + v);
    if constexpr (R) {
      int32_t four;
      std::memcpy(&four, s + v, 4);
      const __m128i bytes = _mm_cvtsi32_si128(four), z = _mm_setzero_si128();
      const __m128i words = _mm_unpacklo_epi16(_mm_unpacklo_epi8(bytes, z), z);
      const __m128 hit = _mm_or_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(words, z)), counted);
      const __m128 pos = _mm_cmpgt_ps(xv, zero);
      const __m128 scaled = _mm_or_ps(_mm_and_ps(pos, _mm_div_ps(xv, vrep)),
                                      _mm_andnot_ps(pos, _mm_mul_ps(xv, vrep)));
      xv = _mm_or_ps(_mm_and_ps(hit, scaled), _mm_andnot_ps(hit, xv));
    }
    if constexpr (P) xv = _mm_sub_ps(xv, _mm_mul_ps(vpres, _mm_and_ps(counted, one)));
    if constexpr (F) xv = _mm_sub_ps(xv, _mm_mul_ps(vfreq, cv));
    _mm_storeu_ps(x + v, xv);
  }
  for (; v < V; ++v) {  // the tail, and a token in flight's logit
    const float cv = c[v];
    float xv = x[v];
    if constexpr (R) {
      if (s[v] || cv > 0.0f) xv = xv > 0.0f ? xv / rep : xv * rep;
    }
    if constexpr (P) xv = xv - pres * (cv > 0.0f ? 1.0f : 0.0f);
    if constexpr (F) xv = xv - freq * cv;
    x[v] = xv;
  }
}

using RowFn = void (*)(float*, const float*, const bool*, int64_t, float, float, float);

template <int Flags>
constexpr RowFn row_fn() {
  return &penalize_row<(Flags & 1) != 0, (Flags & 2) != 0, (Flags & 4) != 0>;
}

constexpr RowFn kRowFns[8] = {row_fn<0>(), row_fn<1>(), row_fn<2>(), row_fn<3>(),
                              row_fn<4>(), row_fn<5>(), row_fn<6>(), row_fn<7>()};

}  // namespace


void penalize_rows(at::Tensor& logits, const at::Tensor& rows, const at::Tensor& entries, at::Tensor& counts,
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
  float* cnt = counts.data_ptr<float>();
  const bool* sn = seen.data_ptr<bool>();
  const int64_t* prev = P ? prev_tokens.data_ptr<int64_t>() : nullptr;
  const float* nm = nums.data_ptr<float>();
  TORCH_CHECK(flags >= 0 && flags < 16, "penalize_rows: flags must be in [0, 16)");
  const bool commit = (flags & 8) != 0;
  at::parallel_for(0, k, V >= 32768 ? 1 : 8, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      float* row = x + rw[i] * ld;
      float* c = cnt + en[i] * V;
      const bool* s = sn + en[i] * V;
      const float rep = nm[i * 3], pres = nm[i * 3 + 1], freq = nm[i * 3 + 2];
      // a row at repetition 1.0 skips it (x / 1 and x * 1 are x, bit for bit)
      const int64_t f = rep == 1.0f ? flags & 6 : flags & 7;
      const int64_t tok = pd[i] >= 0 ? prev[pd[i]] : -1;
      const bool flying = tok >= 0 && tok < V;
      const float x_tok = flying ? row[tok] : 0.0f;
      kRowFns[f](row, c, s, V, rep, pres, freq);
      if (flying) {  // its token in flight counts once more: that logit again, from x_tok
        const float c_tok = c[tok] + 1.0f;
        row[tok] = x_tok;
        kRowFns[f](row + tok, &c_tok, s + tok, 1, rep, pres, freq);
        if (commit) c[tok] = c_tok;
      }
    }
  });
}

}  // namespace zs_ops

TORCH_LIBRARY_FRAGMENT(zeroserve, lib) {
  lib.def(
      "penalize_rows(Tensor(a!) logits, Tensor rows, Tensor entries, Tensor(b!) counts, Tensor seen, Tensor pending, "
      "Tensor prev_tokens, Tensor nums, int flags) -> ()");
}

TORCH_LIBRARY_IMPL(zeroserve, CPU, lib) { lib.impl("penalize_rows", &zs_ops::penalize_rows); }
