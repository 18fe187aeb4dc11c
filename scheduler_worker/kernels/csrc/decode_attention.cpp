// Paged decode attention: one query token per sequence against its KV blocks, read in
// place through the block table (no gather, no padding mask), float32 accumulation for
// every cache type: float32 q over float32 or float16 caches (the float16 cache of float32
// models, --kv-cache-dtype auto), bfloat16 over bfloat16. Any number of query heads per KV
// head and any head size; the common ones (head size 64 / 128 / 256, 1-8 query heads per
// KV head) get loops of compile-time length. One variant per ISA path (zs_isa.h).
//
// At many streams decode attention is bound by memory, not arithmetic: every step reads
// each sequence's whole cache of every layer (32 streams of ~200 tokens of SmolLM2: 283 MB
// a step in float32), from DRAM. Hence float16 caches, tasks of whole sequences (a block
// read as one span), and software prefetch of the next block.
//
// A sliding window W (> 0; 0: none) limits a sequence of L tokens to its last W keys,
// positions L - W .. L - 1, as transformers' sliding-window mask: the blocks before them
// are never read (a windowed request's table holds the placeholder block there once it
// gave them back).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "decode_attention_blocks.h"
#include "zs_isa.h"
#include "zs_ops.h"
#include "zs_team.h"

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <limits>
#include <type_traits>
#include <vector>

namespace zs_ops {
namespace {

template <typename T, typename C>
struct AttnArgs {
  const T* q;            // [B, H, D]
  const C* k_cache;      // [num_blocks, block_size, Hkv, D]
  const C* v_cache;
  const int64_t* tables; // [B, max_blocks]
  const int64_t* lens;   // [B]: tokens to attend (cached context incl. this step's token)
  T* out;                // [B, H, D]
  int64_t H, Hkv, D, block_size, max_blocks;
  float scale;
  int64_t window;        // > 0: attend only the last `window` keys
};

// The first key position a sequence of L tokens attends.
ZS_INLINE int64_t first_key(int64_t L, int64_t window) { return window > 0 && L > window ? L - window : 0; }

struct Scratch {  // one thread's buffers; a query's: its heads' scores, accumulators and q
  float* buf;       // query i's at buf + i * heads * (max_len + 2 * D)
  int64_t max_len;  // the longest context any query of the call attends
};

// KV heads [h0, h1) of the m queries b0 .. b0 + m - 1 (m > 1: a drafted row's 1 + k
// verify queries, consecutive positions of one sequence: Scheduler's drafts through
// spec/verify_rows.py). Each KV head's G query heads share every K/V row they read, and
// the m queries share every block: a block is read once for all of them (from memory
// once, from cache m - 1 times) where m tasks of one query each read the context m
// times. Each query's arithmetic is exactly a task of its own (same operations, same
// order, its own block table), so a verify row equals a plain decode step bit for bit.
// The block table is walked block by block; a block holds block_size tokens, each
// token's heads side by side (row = Hkv * D elements), so a task of every KV head reads
// each block as one span of memory.
// DIM, GRP: the head size and the query heads per KV head when they are compile-time
// constants (fixed-length loops the compiler unrolls), else 0 and a.D, a.H / a.Hkv are
// used. VEC: the vector blocks of this build (1: AVX2, 2: AVX-512; 0: none), which serve
// the fixed head sizes (a multiple of 8 or 16) and groups.
template <typename T, typename C, int DIM, int GRP, int VEC>
ZS_INLINE void attend_impl(const AttnArgs<T, C>& a, int64_t b0, int64_t m, int64_t h0, int64_t h1, const Scratch& s) {
  constexpr bool v512 = VEC == 2 && DIM > 0 && DIM % 16 == 0 && GRP > 0;
  constexpr bool v256 = VEC == 1 && DIM > 0 && DIM % 8 == 0 && GRP > 0;
  const int64_t G = GRP > 0 ? GRP : a.H / a.Hkv, D = DIM > 0 ? DIM : a.D, bs = a.block_size;
  const int64_t nh = h1 - h0, row = a.Hkv * D, heads = nh * G, stride = heads * (s.max_len + 2 * D);
  // query i: scores [heads, n_keys(i)] (scores[(h * G + g) * n_keys + t - s0]), then its
  // accumulators [heads, D], then its query heads in float32, pre-scaled [heads, D]
  auto scores = [&](int64_t i) __attribute__((always_inline)) { return s.buf + i * stride; };
  auto acc = [&](int64_t i) __attribute__((always_inline)) { return s.buf + i * stride + heads * s.max_len; };
  auto qf = [&](int64_t i) __attribute__((always_inline)) { return acc(i) + heads * D; };
  auto len = [&](int64_t i) __attribute__((always_inline)) { return a.lens[b0 + i]; };
  auto start = [&](int64_t i) __attribute__((always_inline)) { return first_key(len(i), a.window); };
  auto n_keys = [&](int64_t i) __attribute__((always_inline)) { return len(i) - start(i); };
  for (int64_t i = 0; i < m; ++i) {
    const T* q = a.q + ((b0 + i) * a.H + h0 * G) * D;
    float* qi = qf(i);
    for (int64_t x = 0; x < heads * D; ++x) qi[x] = f32(q[x]) * a.scale;
  }
  const int64_t L_end = len(m - 1), first = start(0) - start(0) % bs;  // query 0 starts first
  // (the lambdas always inline: each path's copy of this function then compiles them for
  // its own ISA)
  auto block = [&](int64_t i, const C* cache, int64_t t0) __attribute__((always_inline)) {
    return cache + a.tables[(b0 + i) * a.max_blocks + t0 / bs] * bs * row + h0 * D;
  };
  // the first block of keys asked for (K's before the scores, V's before the softmax,
  // which then runs under its fetch)
  auto first_block = [&](const C* cache) __attribute__((always_inline)) {
    prefetch_rows(block(0, cache, first), row, std::min(bs, len(0) - first), nh * D);
  };
  // fn(i, block's first row of the task's heads, t0, keys [j0, n) of the block, the next
  // block's first row and its key count) over the blocks, and per block over the queries
  // whose keys it holds. fn asks for the next block (the last query's: the longest) a
  // share at a time while it computes this one: per KV head, and in the vector blocks per
  // query head (scores) or per key (values). A whole block asked for at once (~100 lines)
  // waits on the miss buffers, and the loads of the block in hand wait behind it: compute
  // and memory then run one after the other (the figures: docs/benchmarks.md, "Sixth
  // round").
  auto each_block = [&](const C* cache, auto&& fn) __attribute__((always_inline)) {
    for (int64_t t0 = first; t0 < L_end; t0 += bs) {
      for (int64_t i = 0; i < m; ++i) {
        const int64_t L = len(i), s0 = start(i);
        if (t0 >= L || t0 + bs <= s0) continue;
        const bool more = i == m - 1 && t0 + bs < L;
        fn(i, block(i, cache, t0), t0, std::max<int64_t>(s0 - t0, 0), std::min(bs, L - t0),
           more ? block(i, cache, t0 + bs) : nullptr, more ? std::min(bs, L - t0 - bs) : 0);
      }
    }
  };
  first_block(a.k_cache);
  each_block(a.k_cache, [&](int64_t i, const C* kb, int64_t t0, int64_t j0, int64_t n, const C* next,
                            int64_t n_next) __attribute__((always_inline)) {
    const int64_t nk = n_keys(i), s0 = start(i);
    const float* qi = qf(i);
    for (int64_t h = 0; h < nh; ++h) {
      const C* next_h = next ? next + h * D : nullptr;
      float* sc = scores(i) + h * G * nk + t0 - s0;
      if constexpr (v512) {
        block_scores_avx512<C, DIM, GRP>(qi + h * G * D, kb + h * D, row, j0, n, sc, nk, next_h, n_next);
      } else if constexpr (v256) {
        block_scores_avx2<C, DIM, GRP>(qi + h * G * D, kb + h * D, row, j0, n, sc, nk, next_h, n_next);
      } else {
        if (next_h) prefetch_rows(next_h, row, n_next, D);
        for (int64_t j = j0; j < n; ++j) {
          const C* k = kb + j * row + h * D;
          for (int64_t g = 0; g < G; ++g) {
            const float* qg = qi + (h * G + g) * D;
            float dot = 0.f;
#pragma omp simd reduction(+ : dot)
            for (int64_t x = 0; x < D; ++x) dot += qg[x] * f32(k[x]);
            sc[g * nk + j] = dot;
          }
        }
      }
    }
  });
  first_block(a.v_cache);  // under the softmax
  const ExpRange range;
  for (int64_t i = 0; i < m; ++i) {
    const int64_t nk = n_keys(i);
    for (int64_t g = 0; g < heads; ++g) {
      float* sg = scores(i) + g * nk;
      float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
      for (int64_t t = 0; t < nk; ++t) mx = __builtin_isgreater(sg[t], mx) ? sg[t] : mx;  // std::max: scalar on AVX2
      float sum = 0.f;
      if constexpr (VEC == 2) {
#pragma omp simd reduction(+ : sum)
        for (int64_t t = 0; t < nk; ++t) {
          sg[t] = fast_exp(sg[t] - mx, range);
          sum += sg[t];
        }
      } else {  // the exps in vectors, their sum in order: the bits these paths always gave
#pragma omp simd
        for (int64_t t = 0; t < nk; ++t) sg[t] = fast_exp(sg[t] - mx, range);
        for (int64_t t = 0; t < nk; ++t) sum += sg[t];
      }
      const float inv = 1.f / sum;
#pragma omp simd
      for (int64_t t = 0; t < nk; ++t) sg[t] *= inv;
    }
    std::fill(acc(i), acc(i) + heads * D, 0.f);
  }
  each_block(a.v_cache, [&](int64_t i, const C* vb, int64_t t0, int64_t j0, int64_t n, const C* next,
                            int64_t n_next) __attribute__((always_inline)) {
    const int64_t nk = n_keys(i), s0 = start(i);
    for (int64_t h = 0; h < nh; ++h) {
      const C* next_h = next ? next + h * D : nullptr;
      const float* sc = scores(i) + h * G * nk + t0 - s0;
      float* ah = acc(i) + h * G * D;
      if constexpr (v512) {
        block_values_avx512<C, DIM, GRP>(sc, vb + h * D, row, j0, n, nk, ah, next_h, n_next);
      } else if constexpr (v256) {
        block_values_avx2<C, DIM, GRP>(sc, vb + h * D, row, j0, n, nk, ah, next_h, n_next);
      } else {
        if (next_h) prefetch_rows(next_h, row, n_next, D);
        for (int64_t j = j0; j < n; ++j) {
          const C* v = vb + j * row + h * D;
          for (int64_t g = 0; g < G; ++g) {
            const float p = sc[g * nk + j];
            float* ag = ah + g * D;
#pragma omp simd
            for (int64_t x = 0; x < D; ++x) ag[x] += p * f32(v[x]);
          }
        }
      }
    }
  });
  for (int64_t i = 0; i < m; ++i) {
    T* o = a.out + ((b0 + i) * a.H + h0 * G) * D;
    const float* ai = acc(i);
    for (int64_t x = 0; x < heads * D; ++x) o[x] = static_cast<T>(ai[x]);
  }
}

// The three paths of ZS_VARIANTS by hand, each with its own vector blocks (none portable).
#define ZS_ATTEND_PARAMS const AttnArgs<T, C>&a, int64_t b0, int64_t m, int64_t h0, int64_t h1, const Scratch &s
template <typename T, typename C, int DIM, int GRP>
void attend_0(ZS_ATTEND_PARAMS) { attend_impl<T, C, DIM, GRP, 0>(a, b0, m, h0, h1, s); }
template <typename T, typename C, int DIM, int GRP>
ZS_TARGET_AVX2 void attend_1(ZS_ATTEND_PARAMS) { attend_impl<T, C, DIM, GRP, 1>(a, b0, m, h0, h1, s); }
template <typename T, typename C, int DIM, int GRP>
ZS_TARGET_AVX512 void attend_2(ZS_ATTEND_PARAMS) { attend_impl<T, C, DIM, GRP, 2>(a, b0, m, h0, h1, s); }

template <typename T, typename C>
using AttendFn = void (*)(const AttnArgs<T, C>&, int64_t, int64_t, int64_t, int64_t, const Scratch&);

template <typename T, typename C, int DIM>
AttendFn<T, C> pick_group(int64_t G, int64_t isa) {
  switch (G) {
    case 1: return ZS_PICK(attend, (<T, C, DIM, 1>), isa);
    case 2: return ZS_PICK(attend, (<T, C, DIM, 2>), isa);
    case 3: return ZS_PICK(attend, (<T, C, DIM, 3>), isa);
    case 4: return ZS_PICK(attend, (<T, C, DIM, 4>), isa);
    case 8: return ZS_PICK(attend, (<T, C, DIM, 8>), isa);
    default: return ZS_PICK(attend, (<T, C, DIM, 0>), isa);
  }
}

template <typename T, typename C>
AttendFn<T, C> pick(int64_t D, int64_t G, int64_t isa) {
  if (D == 64) return pick_group<T, C, 64>(G, isa);
  if (D == 128) return pick_group<T, C, 128>(G, isa);
  if (D == 256) return pick_group<T, C, 256>(G, isa);
  return ZS_PICK(attend, (<T, C, 0, 0>), isa);
}

constexpr int64_t kMaxRun = 17;  // queries a task takes together: 1 + the most drafts a row has
// A run's scratch (every query's scores, accumulators and q) is held per thread: a long
// prompt's run at a long context is cut to fit this many bytes (each query's arithmetic is
// its own whatever the run, so only the blocks' rereads change)
constexpr int64_t kRunScratch = 4 << 20;

// Whether query b continues query b - 1's run: the next position of the same sequence
// (one position on, the same blocks). Only a saving: each query reads its own table.
template <typename T, typename C>
bool continues(const AttnArgs<T, C>& a, int64_t b) {
  const int64_t L = a.lens[b - 1];
  if (a.lens[b] != L + 1) return false;
  const int64_t* t0 = a.tables + (b - 1) * a.max_blocks;
  const int64_t* t1 = a.tables + b * a.max_blocks;
  const int64_t j0 = first_key(L, a.window) / a.block_size, j1 = (L + a.block_size - 1) / a.block_size;
  return std::equal(t0 + j0, t0 + j1, t1 + j0);
}

// Tasks of whole runs of queries (every KV head: each block read as one span) when there
// are enough runs to keep every thread busy, else of one KV head each.
template <typename T, typename C>
void attend_all(const AttnArgs<T, C>& a, int64_t B, int64_t isa) {
  const int64_t G = a.H / a.Hkv;
  const AttendFn<T, C> fn = pick<T, C>(a.D, G, isa);
  int64_t max_len = 0, max_run = 1;
  for (int64_t b = 0; b < B; ++b) max_len = std::max(max_len, a.lens[b] - first_key(a.lens[b], a.window));
  const int64_t per_query = a.H * (max_len + 2 * a.D) * static_cast<int64_t>(sizeof(float));
  const int64_t run_cap = std::clamp<int64_t>(kRunScratch / per_query, 1, kMaxRun);
  std::vector<int64_t> runs{0};  // run r: queries runs[r] .. runs[r + 1] - 1
  for (int64_t b = 1; b < B; ++b) {
    if (b - runs.back() >= run_cap || !continues(a, b)) runs.push_back(b);
    max_run = std::max(max_run, b + 1 - runs.back());
  }
  runs.push_back(B);
  const int64_t R = static_cast<int64_t>(runs.size()) - 1;
  const int64_t per_task = R >= 2 * zs_team::num_threads() ? a.Hkv : 1, tasks_per_run = a.Hkv / per_task;
  const int64_t heads = per_task * G;
  zs_team::parallel_for(0, R * tasks_per_run, 1, [&](int64_t w0, int64_t w1) {
    std::vector<float> buf(static_cast<size_t>(max_run * heads * (max_len + 2 * a.D)));
    const Scratch s{buf.data(), max_len};
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t r = w / tasks_per_run, h0 = (w % tasks_per_run) * per_task;
      fn(a, runs[r], runs[r + 1] - runs[r], h0, h0 + per_task, s);
    }
  });
}

}  // namespace

at::Tensor paged_decode_attention(const at::Tensor& q_in, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& context_lens, double scale,
                                  int64_t isa, int64_t window) {
  ZS_PIECE("attention");
  TORCH_CHECK(q_in.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(), "decode attention: bad shapes");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "decode attention: caches must be contiguous");
  TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type(), "decode attention: the caches must share a dtype");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && context_lens.scalar_type() == at::kLong,
              "decode attention: block tables and lengths must be int64");
  const at::Tensor q = q_in.contiguous();
  const at::Tensor tables = block_tables.contiguous(), lens = context_lens.contiguous();
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), Hkv = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == D && Hkv >= 1 && H % Hkv == 0, "decode attention: head counts or sizes disagree");
  TORCH_CHECK(tables.dim() == 2 && tables.size(0) == B && lens.size(0) == B, "decode attention: one table and length per sequence");
  const int64_t block_size = k_cache.size(1), max_blocks = tables.size(1), num_blocks = k_cache.size(0);
  const int64_t* lp = lens.data_ptr<int64_t>();
  const int64_t* tp = tables.data_ptr<int64_t>();
  TORCH_CHECK(window >= 0, "decode attention: a negative window");
  for (int64_t b = 0; b < B; ++b) {  // every block id read below, once per sequence
    TORCH_CHECK(lp[b] >= 1 && lp[b] <= max_blocks * block_size, "decode attention: context length ", lp[b],
                " outside its block table");
    for (int64_t j = first_key(lp[b], window) / block_size; j < (lp[b] + block_size - 1) / block_size; ++j) {
      const int64_t id = tp[b * max_blocks + j];
      TORCH_CHECK(id >= 0 && id < num_blocks, "decode attention: block id ", id, " of sequence ", b,
                  " outside the cache's ", num_blocks, " blocks");
    }
  }
  isa = zs_qgemm::clamp_isa(isa);
  at::Tensor out = at::empty_like(q);
  auto run = [&](auto* qp, auto* cp) {
    using T = std::remove_pointer_t<decltype(qp)>;
    using C = std::remove_pointer_t<decltype(cp)>;
    const AttnArgs<T, C> a{qp, k_cache.data_ptr<C>(), v_cache.data_ptr<C>(), tp, lp, out.data_ptr<T>(),
                           H, Hkv, D, block_size, max_blocks, static_cast<float>(scale), window};
    attend_all(a, B, isa);
  };
  const auto qt = q.scalar_type(), ct = k_cache.scalar_type();
  if (qt == at::kFloat && ct == at::kFloat) run(q.data_ptr<float>(), static_cast<float*>(nullptr));
  else if (qt == at::kFloat && ct == at::kHalf) run(q.data_ptr<float>(), static_cast<c10::Half*>(nullptr));
  else if (qt == at::kBFloat16 && ct == at::kBFloat16) run(q.data_ptr<c10::BFloat16>(), static_cast<c10::BFloat16*>(nullptr));
  else TORCH_CHECK(false, "decode attention: q and caches of ", qt, " and ", ct,
                   " (float32 with float32 or float16 caches, bfloat16 with bfloat16)");
  return out;
}

}  // namespace zs_ops

TORCH_LIBRARY_FRAGMENT(zeroserve, lib) {
  lib.def("paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor context_lens, float scale, int isa, int window=0) -> Tensor");
}

TORCH_LIBRARY_IMPL(zeroserve, CPU, lib) { lib.impl("paged_decode_attention", &zs_ops::paged_decode_attention); }
