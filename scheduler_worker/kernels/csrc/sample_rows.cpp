// A step's sampling on the CPU, each row in a few passes over its logits (sampling.py's
// module doc has the semantics; the torch path there takes ~8 passes over the whole batch):
//
//   sample_rows   tokens [R] int64 from the processed logits [R, V] float32: a row with no
//                 uniforms takes the argmax, the others draw (temperature, top-k, top-p, min-p,
//                 the two-level exponential race on their uniforms)
//   (logprob_rows.cpp: the logprobs rows', on the kernels and top_n below: sample_rows.h)
//
// A drawing row, its logits x:
//   pass 1   a = x / T, NaN -> -inf and +inf -> the largest float (before top-k: the torch
//            path repairs after it, which differs only on a row that had +inf or NaN), max
//   (top-k)  the k-th largest a, from a heap of the k largest (ties with it kept)
//   pass 2   e = exp(a - max) for the kept a (0 for the rest, -inf included), their sum
//   (top-p)  the candidates' probabilities p = e / sum in bins of their high 12 bits
//            (float64 mass), the bin where the mass from the top reaches top_p, then its
//            values sorted: t is the value where the running mass reaches it (ties kept),
//            as top_p.py defines it; min-p raises t to p_max * min_p
//   pass 3   the blocks of 256 tokens' sums of the p >= t, the race among them on the
//            row's first uniforms (argmin sum / log u), then among the winning block's tokens
//
// The numbers are the torch path's but for the exp (zs_isa.h fast_exp, < 2e-7 relative, where
// torch's is within 1 ulp) and the order of float32 sums: a token can differ from the torch
// path's only where two race values, or a value and a threshold, are within ~1e-6 of each other.
// The uniforms are the caller's: a seeded row still draws what it would alone.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "sample_rows.h"
#include "zs_isa.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

namespace zs_ops {
namespace {

constexpr int64_t kBlock = 256;                 // sampling.py SAMPLE_BLOCK
constexpr int kBinShift = 20;                   // bins of a probability's high 12 bits
constexpr int64_t kBins = (0x3F800000 >> kBinShift) + 1;  // 1.0f's bin is the last
constexpr double kTiny = 1e-30;                 // top_p.py _TINY
constexpr int64_t kHeapK = 4096;                // larger k: nth_element on a copy

// The first index of the largest value (NaN counting as largest), as torch's max(dim) gives.
ZS_INLINE int64_t argmax_row_impl(const float* x, int64_t V) {
  float mx = -std::numeric_limits<float>::infinity();
  int nan = 0;
#pragma omp simd reduction(max : mx) reduction(| : nan)
  for (int64_t i = 0; i < V; ++i) {
    mx = __builtin_isgreater(x[i], mx) ? x[i] : mx;
    nan |= x[i] != x[i];
  }
  for (int64_t i0 = 0; i0 < V; i0 += kBlock) {  // the first block holding it, then the index
    const int64_t i1 = std::min(V, i0 + kBlock);
    int hit = 0;
#pragma omp simd reduction(| : hit)
    for (int64_t i = i0; i < i1; ++i) hit |= nan ? x[i] != x[i] : x[i] == mx;
    if (hit)
      for (int64_t i = i0; i < i1; ++i)
        if (nan ? x[i] != x[i] : x[i] == mx) return i;
  }
  return 0;
}

// pass 1: a = x / T repaired, returns max(a).
ZS_INLINE float scale_row_impl(const float* x, float* a, int64_t V, float T) {
  constexpr float big = std::numeric_limits<float>::max();
  const float ninf = -std::numeric_limits<float>::infinity();
  float mx = ninf;
#pragma omp simd reduction(max : mx)
  for (int64_t i = 0; i < V; ++i) {
    float v = x[i] / T;
    v = v != v ? ninf : v;
    v = v > big ? big : v;
    a[i] = v;
    mx = v > mx ? v : mx;
  }
  return mx;
}

// pass 2: a -> p, unnormalized, for a >= lo (0 elsewhere); returns the sum.
ZS_INLINE float exp_row_impl(float* a, int64_t V, float mx, float lo) {
  const ExpRange range;
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < V; ++i) {
    const float e = a[i] >= lo ? fast_exp(a[i] - mx, range) : 0.f;
    a[i] = e;
    sum += e;
  }
  return sum;
}

// The sum of the p = e * inv >= t over a block of n (<= kBlock) values.
ZS_INLINE float block_sum_impl(const float* e, int64_t n, float inv, float t) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) {
    const float p = e[i] * inv;
    s += p >= t ? p : 0.f;
  }
  return s;
}

// The sum of exp(x - mx) over x[0:n], a -inf x counting 0.
ZS_INLINE float exp_sum_impl(const float* x, int64_t n, float mx) {
  const ExpRange range;
  const float ninf = -std::numeric_limits<float>::infinity();
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += x[i] > ninf ? fast_exp(x[i] - mx, range) : 0.f;
  return sum;
}

// The p = e * inv >= floor (and > 0) of e[0:V] appended to out, in order: a block of 16
// whose largest p falls short skipped on a vector max (most of a chat row's vocabulary).
ZS_INLINE void collect_impl(const float* e, int64_t V, float inv, float floor, std::vector<float>* out) {
  constexpr int64_t W = 16;
  for (int64_t i0 = 0; i0 < V; i0 += W) {
    const int64_t i1 = std::min(V, i0 + W);
    float m = 0.f;
#pragma omp simd reduction(max : m)
    for (int64_t i = i0; i < i1; ++i) m = e[i] > m ? e[i] : m;
    if (!(m * inv >= floor && m > 0.f)) continue;  // (e * inv is monotone in e)
    for (int64_t i = i0; i < i1; ++i) {
      const float p = e[i] * inv;
      if (p >= floor && p > 0.f) out->push_back(p);
    }
  }
}

// The largest of a[0:n].
ZS_INLINE float max_of_impl(const float* a, int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t i = 0; i < n; ++i) mx = a[i] > mx ? a[i] : mx;
  return mx;
}

ZS_INLINE void argmax_impl(const float* x, int64_t V, int64_t* out) { *out = argmax_row_impl(x, V); }
ZS_INLINE void scale_impl(const float* x, float* a, int64_t V, float T, float* mx) { *mx = scale_row_impl(x, a, V, T); }
ZS_INLINE void exp_impl(float* a, int64_t V, float mx, float lo, float* sum) { *sum = exp_row_impl(a, V, mx, lo); }
ZS_INLINE void blocks_impl(const float* e, int64_t V, float inv, float t, float* sums) {
  for (int64_t b = 0; b * kBlock < V; ++b)
    sums[b] = block_sum_impl(e + b * kBlock, std::min(kBlock, V - b * kBlock), inv, t);
}
ZS_INLINE void max_of_v_impl(const float* a, int64_t n, float* mx) { *mx = max_of_impl(a, n); }
ZS_INLINE void exp_sum_v_impl(const float* x, int64_t n, float mx, float* sum) { *sum = exp_sum_impl(x, n, mx); }

ZS_VARIANTS((), argmax_v, argmax_impl, (const float* x, int64_t V, int64_t* out), (x, V, out))
ZS_VARIANTS((), scale_v, scale_impl, (const float* x, float* a, int64_t V, float T, float* mx), (x, a, V, T, mx))
ZS_VARIANTS((), exp_v, exp_impl, (float* a, int64_t V, float mx, float lo, float* sum), (a, V, mx, lo, sum))
ZS_VARIANTS((), blocks_v, blocks_impl, (const float* e, int64_t V, float inv, float t, float* sums),
            (e, V, inv, t, sums))
ZS_VARIANTS((), max_of_v, max_of_v_impl, (const float* a, int64_t n, float* mx), (a, n, mx))
ZS_VARIANTS((), collect_v, collect_impl, (const float* e, int64_t V, float inv, float floor, std::vector<float>* out),
            (e, V, inv, floor, out))
ZS_VARIANTS((), exp_sum_v, exp_sum_v_impl, (const float* x, int64_t n, float mx, float* sum), (x, n, mx, sum))

}  // namespace

Kernels kernels_for(int64_t isa) {
  const int64_t cl = zs_qgemm::clamp_isa(isa);
  return {ZS_PICK(argmax_v, (), cl), ZS_PICK(scale_v, (), cl),  ZS_PICK(exp_v, (), cl),
          ZS_PICK(blocks_v, (), cl), ZS_PICK(max_of_v, (), cl), ZS_PICK(exp_sum_v, (), cl),
          ZS_PICK(collect_v, (), cl)};
}

// top_n (sample_rows.h): a min-heap of the n best so far, a block of 64 skipped when none of
// it beats the heap's least.
void top_n(const Kernels& kn, const float* x, int64_t V, int64_t n, int64_t* ids, float* values,
           std::vector<std::pair<float, int64_t>>& heap) {
  // a before b: the better one (larger value, then lower index) is "greater"
  const auto better = [](const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  heap.clear();
  for (int64_t i = 0; i < n; ++i) heap.emplace_back(x[i], i);
  std::make_heap(heap.begin(), heap.end(), better);  // front: the least of the n
  constexpr int64_t skip = 64;
  for (int64_t i0 = n; i0 < V; i0 += skip) {
    const int64_t i1 = std::min(V, i0 + skip);
    float mx;
    kn.max_of(x + i0, i1 - i0, &mx);
    if (!(mx > heap.front().first)) continue;  // an equal value has a higher index: not better
    for (int64_t i = i0; i < i1; ++i) {
      if (x[i] > heap.front().first) {
        std::pop_heap(heap.begin(), heap.end(), better);
        heap.back() = {x[i], i};
        std::push_heap(heap.begin(), heap.end(), better);
      }
    }
  }
  std::sort_heap(heap.begin(), heap.end(), better);  // best first
  for (int64_t j = 0; j < n; ++j) {
    ids[j] = heap[j].second;
    values[j] = heap[j].first;
  }
}

namespace {

// The k-th largest of a[0:V] (1 <= k < V), duplicates counted: top_n's last, or past
// kHeapK a selection on a copy.
float kth_largest(const Kernels& kn, const float* a, int64_t V, int64_t k, std::vector<float>& buf,
                  std::vector<int64_t>& ids, std::vector<std::pair<float, int64_t>>& heap) {
  if (k > kHeapK) {
    buf.assign(a, a + V);
    std::nth_element(buf.begin(), buf.begin() + (k - 1), buf.end(), std::greater<float>());
    return buf[k - 1];
  }
  buf.resize(k);
  ids.resize(k);
  top_n(kn, a, V, k, ids.data(), buf.data(), heap);
  return buf[k - 1];
}

// The top-p threshold of p = e * inv (normalized, >= 0): the value at which the mass from
// the largest down, summed in float64, reaches goal (ties kept); 0 where it never does.
// The p >= c are its candidates, with c low enough that the rest cannot hold 1 - goal of
// the mass (the cut is then among them); where they fall short after all, every p is one.
float top_p_threshold(const Kernels& kn, const float* e, int64_t V, float inv, double goal, std::vector<float>& cand,
                      std::vector<double>& hist, std::vector<float>& bin) {
  const float c = static_cast<float>((1.0 - goal) / (2.0 * static_cast<double>(V)));
  for (const float floor : {c, 0.f}) {
    cand.clear();
    kn.collect(e, V, inv, floor, &cand);
    hist.assign(kBins, 0.0);
    for (const float p : cand) hist[std::min<int64_t>(std::bit_cast<uint32_t>(p) >> kBinShift, kBins - 1)] += p;
    double above = 0.0;
    int64_t b1 = kBins - 1;
    for (; b1 >= 0; --b1) {
      if (above + hist[b1] >= goal) break;
      above += hist[b1];
    }
    if (b1 < 0) {
      if (floor > 0.f) continue;  // the candidates fell short: every p
      return 0.f;
    }
    bin.clear();
    for (const float p : cand)
      if (std::min<int64_t>(std::bit_cast<uint32_t>(p) >> kBinShift, kBins - 1) == b1) bin.push_back(p);
    std::sort(bin.begin(), bin.end(), std::greater<float>());
    double mass = above;
    size_t keep = 0;
    for (const float w : bin) {
      mass += w;
      if (mass - w < goal) ++keep;
    }
    return bin[std::max<size_t>(keep, 1) - 1];
  }
  return 0.f;
}

// The winner of an exponential race among values v[0:n] on uniforms u: argmin v / log(u),
// the first on ties (torch's argmin); a v of 0 never wins (a u of 1.0, which the seeded
// hash can give, would make its 0 / 0 a NaN), nor does anything where every v is 0: 0.
int64_t race(const float* v, const float* u, int64_t n) {
  int64_t best = 0;
  float best_r = std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    if (!(v[i] > 0.f)) continue;
    const float r = v[i] / std::log(u[i]);
    if (r < best_r) {
      best_r = r;
      best = i;
    }
  }
  return best;
}

struct Scratch {
  std::vector<float> p, buf, cand, bin, sums;
  std::vector<int64_t> ids;
  std::vector<double> hist;
  std::vector<std::pair<float, int64_t>> heap;
};

int64_t draw_row(const Kernels& k, const float* x, int64_t V, const double* prm, const float* u, Scratch& s) {
  const float T = static_cast<float>(prm[0]), top_p = static_cast<float>(prm[2]), min_p = static_cast<float>(prm[3]);
  int64_t top_k = static_cast<int64_t>(prm[1]);
  if (top_k <= 0 || top_k >= V) top_k = 0;
  s.p.resize(V);
  float* p = s.p.data();
  float mx;
  k.scale(x, p, V, T, &mx);
  if (mx == -std::numeric_limits<float>::infinity()) return 0;  // every token masked: the torch path's 0
  float lo = -std::numeric_limits<float>::max();  // -inf (a masked token) is never kept
  if (top_k) lo = std::max(lo, kth_largest(k, p, V, top_k, s.buf, s.ids, s.heap));
  float sum;
  k.exp(p, V, mx, lo, &sum);  // p: unnormalized from here, p * inv the probabilities
  const float inv = 1.f / sum;
  float t = 0.f;
  if (top_p < 1.f)
    t = top_p_threshold(k, p, V, inv, std::max(static_cast<double>(top_p), kTiny), s.cand, s.hist, s.bin);
  if (min_p > 0.f) t = std::max(t, inv * min_p);  // inv: the largest probability (exp(0) = 1)
  const int64_t nb = (V + kBlock - 1) / kBlock;
  s.sums.resize(std::max(nb, kBlock));
  k.blocks(p, V, inv, t, s.sums.data());
  const int64_t b = race(s.sums.data(), u, nb);
  const int64_t start = b * kBlock, n = std::min(kBlock, V - start);
  float* inside = s.sums.data();  // the block's probabilities, 0 where cut (and past the vocabulary)
  for (int64_t i = 0; i < kBlock; ++i) {
    const float q = i < n ? p[start + i] * inv : 0.f;
    inside[i] = q >= t ? q : 0.f;
  }
  return start + race(inside, u + nb, kBlock);
}

}  // namespace

// logits [R, V] float32; draw [R] int64: the row of u a drawing row takes, -1 for an argmax
// row; params [R, 4] float64: temperature, top_k (0: off), top_p, min_p; u [D, n] float32
// (n = sampling.num_uniforms(V)). Returns tokens [R] int64.
at::Tensor sample_rows(const at::Tensor& logits, const at::Tensor& draw, const at::Tensor& params,
                       const at::Tensor& u, int64_t isa) {
  // rows may be apart (a view of logits whose vocabulary the model pads): ld their stride
  TORCH_CHECK(logits.dim() == 2 && logits.stride(1) == 1 && logits.scalar_type() == at::kFloat,
              "sample_rows: logits must be float32 [R, V], each row contiguous");
  const int64_t R = logits.size(0), V = logits.size(1), ld = logits.stride(0);
  TORCH_CHECK(draw.dim() == 1 && draw.size(0) == R && draw.scalar_type() == at::kLong && draw.is_contiguous(),
              "sample_rows: draw must be a contiguous int64 [R]");
  TORCH_CHECK(params.dim() == 2 && params.size(0) == R && params.size(1) == 4 && params.is_contiguous() &&
                  params.scalar_type() == at::kDouble,
              "sample_rows: params must be a contiguous float64 [R, 4]");
  const int64_t nb = (V + kBlock - 1) / kBlock, n = nb + kBlock;
  TORCH_CHECK(u.dim() == 2 && u.is_contiguous() && u.scalar_type() == at::kFloat && (u.size(0) == 0 || u.size(1) == n),
              "sample_rows: u must be a contiguous float32 [D, ", n, "]");
  const int64_t D = u.size(0);
  const int64_t* dr = draw.data_ptr<int64_t>();
  for (int64_t r = 0; r < R; ++r) TORCH_CHECK(dr[r] >= -1 && dr[r] < D, "sample_rows: draw index out of range");
  at::Tensor out = at::empty({R}, draw.options());
  int64_t* tok = out.data_ptr<int64_t>();
  const float* x = logits.data_ptr<float>();
  const double* prm = params.data_ptr<double>();
  const float* uu = D ? u.data_ptr<float>() : nullptr;
  const Kernels k = kernels_for(isa);
  at::parallel_for(0, R, 1, [&](int64_t r0, int64_t r1) {
    thread_local Scratch s;
    for (int64_t r = r0; r < r1; ++r) {
      if (dr[r] < 0)
        k.argmax(x + r * ld, V, tok + r);
      else
        tok[r] = draw_row(k, x + r * ld, V, prm + r * 4, uu + dr[r] * n, s);
    }
  });
  return out;
}

}  // namespace zs_ops

TORCH_LIBRARY_FRAGMENT(zeroserve, lib) {
  lib.def("sample_rows(Tensor logits, Tensor draw, Tensor params, Tensor u, int isa) -> Tensor");
}

TORCH_LIBRARY_IMPL(zeroserve, CPU, lib) {
  lib.impl("sample_rows", &zs_ops::sample_rows);
}
