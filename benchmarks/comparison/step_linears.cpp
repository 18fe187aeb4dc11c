// One decode step's linears at M activation rows (default 1), one thread: ours (the AVX2
// tiles of scheduler_worker/kernels/csrc, called directly, with and without the software
// prefetch of the weights; "avx512": this CPU's tiles too) against llama.cpp's vec_dot (row by row,
// as its mul_mat runs them on an AVX2 build), every linear of a GGUF file's step in order
// with its own weights (the step streams the whole file from memory, as a served token
// does), and each op alone with its weights in cache. Built against a llama.cpp build's
// static ggml libraries (never part of install or CI), docs/benchmarks.md "AVX2 K-quants
// at one stream":
//   g++ -O3 -std=c++20 -fopenmp -o /tmp/step_linears benchmarks/comparison/step_linears.cpp \
//      -I. -I$TORCH/include -I$LLAMA/ggml/include \
//      $LLAMA/build-avx2/ggml/src/libggml-cpu.a $LLAMA/build-avx2/ggml/src/libggml-base.a -lpthread
//   /tmp/step_linears SPEC [steps [avx2|avx512 [rows]]]
// SPEC: one "TYPE N K" line per linear in step order (docs/benchmarks.md writes it from a
// GGUF file with gguf-py).
// The weights are random valid blocks (the values do not change the time).
#include <ggml-cpu.h>
#include <ggml.h>

#include <algorithm>
#include <ctime>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "scheduler_worker/kernels/csrc/quant/arch/avx2/gemm.cpp"
#include "scheduler_worker/kernels/csrc/quant/arch/avx512/gemm.cpp"

using namespace zs_qgemm;

// the thread's CPU time: on a shared machine, time preempted is not the kernels'
static double now() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

struct Op {
  std::string type;
  int64_t N, K;
  int fmt;
  std::vector<uint8_t> q;  // ours: packed bytes (random), d (and m) float16
  std::vector<c10::Half> d;  // where there is an m: d and m interleaved per unit, as the weight arena holds them
  std::vector<uint8_t> lq;  // llama.cpp's rows
  ggml_type lt;
};

static int fmt_of(const std::string& t) {
  if (t == "Q8_0") return Q8;
  if (t == "Q6_K") return Q6K;
  if (t == "Q5_0") return Q50;
  if (t == "Q5_1") return Q5;
  if (t == "Q4_K") return Q4K;
  if (t == "Q5_K") return Q5K;
  return Q4;
}

static ggml_type ltype_of(const std::string& t) {
  if (t == "Q8_0") return GGML_TYPE_Q8_0;
  if (t == "Q6_K") return GGML_TYPE_Q6_K;
  if (t == "Q5_0") return GGML_TYPE_Q5_0;
  if (t == "Q5_1") return GGML_TYPE_Q5_1;
  if (t == "Q4_K") return GGML_TYPE_Q4_K;
  if (t == "Q5_K") return GGML_TYPE_Q5_K;
  if (t == "Q4_0") return GGML_TYPE_Q4_0;
  return GGML_TYPE_Q4_1;
}

template <int FMT>
static GroupsFn groups_of(bool avx512) {
  return avx512 ? &avx512::groups<FMT> : &avx2::groups<FMT>;
}
static GroupsFn kernel_of(int fmt, bool avx512) {
  switch (fmt) {
    case Q8: return groups_of<Q8>(avx512);
    case Q6K: return groups_of<Q6K>(avx512);
    case Q50: return groups_of<Q50>(avx512);
    case Q5: return groups_of<Q5>(avx512);
    case Q4K: return groups_of<Q4K>(avx512);
    case Q5K: return groups_of<Q5K>(avx512);
    default: return groups_of<Q4>(avx512);
  }
}

struct Scratch {
  std::vector<float> x, out;
  std::vector<int8_t> xq;
  std::vector<float> xd, xs;
  std::vector<int32_t> off;
  std::vector<uint8_t> lx;
};

static int64_t M = 1;  // activation rows

// ours: what qlinear does for M rows on one thread (quantize, piece sums, the groups)
static void run_ours(const Op& op, Scratch& s, bool prefetch, bool avx512) {
  const int64_t nb = op.K / QK;
  for (int64_t i = 0; i < M; ++i)
    avx2::quantize(s.x.data() + i * op.K, false, nb, s.xq.data() + i * op.K, s.xd.data() + i * nb, s.xs.data() + i * nb);
  if (op.fmt == Q6K)
    for (int64_t e = 0; e < M * op.K / 16; ++e) {
      int32_t t = 0;
      for (int j = 0; j < 16; ++j) t += s.xq[e * 16 + j];
      s.off[e] = -32 * t;
    }
  const Act a{s.xq.data(), s.xd.data(), s.xs.data(), s.off.data(), prefetch};
  const bool m = FORMATS[op.fmt].m;
  const Packed w{op.q.data(), op.d.data(), m ? op.d.data() + GR : nullptr, nb, op.N, m ? 2 * GR : GR};
  kernel_of(op.fmt, avx512)(a, w, M, Out{s.out.data(), false}, 0, (op.N + GR - 1) / GR);
}

static void run_llama(const Op& op, Scratch& s) {
  const ggml_type_traits_cpu* tr = ggml_get_type_traits_cpu(op.lt);
  const size_t rb = ggml_row_size(op.lt, op.K), xb = ggml_row_size(tr->vec_dot_type, op.K);
  for (int64_t i = 0; i < M; ++i)
    ggml_get_type_traits_cpu(tr->vec_dot_type)->from_float(s.x.data() + i * op.K, s.lx.data() + i * xb, op.K);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t n = 0; n < op.N; ++n)
      tr->vec_dot(op.K, s.out.data() + i * op.N + n, 0, op.lq.data() + n * rb, 0, s.lx.data() + i * xb, 0, 1);
}

int main(int argc, char** argv) {
  ggml_cpu_init();
  std::ifstream spec(argv[1]);
  const int steps = argc > 2 ? atoi(argv[2]) : 20;
  M = argc > 4 ? atoi(argv[4]) : 1;
  std::vector<Op> ops;
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> byte(0, 255);
  int64_t maxk = 0, maxn = 0;
  double bytes = 0;
  for (std::string t; spec >> t;) {
    Op op;
    op.type = t;
    spec >> op.N >> op.K;
    op.fmt = fmt_of(t);
    op.lt = ltype_of(t);
    const FormatInfo& f = FORMATS[op.fmt];
    const int64_t groups = (op.N + GR - 1) / GR, units = op.K / f.unit;
    op.q.resize(groups * units * f.unit_bytes);
    for (auto& b : op.q) b = byte(rng);
    op.d.assign(groups * units * GR * (f.m ? 2 : 1), c10::Half(0.01f));
    if (f.m)
      for (int64_t u = 0; u < groups * units; ++u) std::fill_n(op.d.begin() + u * 2 * GR + GR, GR, c10::Half(-0.02f));
    // llama.cpp's rows, quantized from random floats a few hundred rows at a time
    const size_t rb = ggml_row_size(op.lt, op.K);
    op.lq.resize(rb * op.N);
    std::vector<float> wf(256 * op.K);
    for (int64_t r0 = 0; r0 < op.N; r0 += 256) {
      const int64_t rows = std::min<int64_t>(256, op.N - r0);
      for (int64_t i = 0; i < rows * op.K; ++i) wf[i] = (byte(rng) - 127.5f) * 1e-3f;
      ggml_quantize_chunk(op.lt, wf.data(), op.lq.data() + r0 * rb, 0, rows, op.K, nullptr);
    }
    bytes += rb * op.N;
    maxk = std::max(maxk, op.K);
    maxn = std::max(maxn, op.N);
    ops.push_back(std::move(op));
  }
  Scratch s;
  s.x.resize(M * maxk);
  for (auto& v : s.x) v = (byte(rng) - 127.5f) / 128.f;
  s.out.resize(M * (maxn + GR));
  s.xq.resize(M * maxk);
  s.xd.resize(M * maxk / QK);
  s.xs.resize(M * maxk / QK);
  s.off.resize(M * maxk / 16);
  s.lx.resize(M * maxk * 2);
  printf("%zu linears, %.1f MB of file weights, %lld rows, %d steps (CPU ms per step: min / median)\n", ops.size(), bytes / 1e6,
         static_cast<long long>(M), steps);

  // whole steps, the variants alternating step by step so drift hits each alike
  const char* names[] = {"ours, prefetch off", "ours, prefetch on", "llama.cpp vec_dot", "avx512, prefetch off",
                         "avx512, prefetch on"};
  const int V = argc > 3 && std::string(argv[3]) == "avx512" ? 5 : 3;  // the AVX-512 tiles too (this CPU's)
  auto run = [&](int v, const Op& op) { v == 2 ? run_llama(op, s) : run_ours(op, s, v % 2 == 1, v >= 3); };
  std::vector<double> t[5];
  for (int r = 0; r < steps + 2; ++r)
    for (int v = 0; v < V; ++v) {
      const double t0 = now();
      for (const Op& op : ops) run(v, op);
      if (r >= 2) t[v].push_back(now() - t0);
    }
  for (int v = 0; v < V; ++v) {
    std::sort(t[v].begin(), t[v].end());
    printf("step  %-20s %7.3f / %7.3f ms  (%.1f GB/s at the min)\n", names[v], t[v][0] * 1e3, t[v][t[v].size() / 2] * 1e3,
           bytes / t[v][0] / 1e9);
  }
  // each op alone, weights in cache (the fastest of 30 calls), summed per type
  std::vector<std::string> types;
  for (const Op& op : ops)
    if (std::find(types.begin(), types.end(), op.type) == types.end()) types.push_back(op.type);
  for (int v = 0; v < V; ++v) {
    printf("alone %-20s", names[v]);
    double total = 0;
    for (const std::string& ty : types) {
      double sum = 0;
      for (const Op& op : ops) {
        if (op.type != ty) continue;
        double best = 1e9;
        for (int r = 0; r < 30; ++r) {
          const double t0 = now();
          run(v, op);
          best = std::min(best, now() - t0);
        }
        sum += best;
      }
      printf(" %s %.3f", ty.c_str(), sum * 1e3);
      total += sum;
    }
    printf(" | sum %.3f ms\n", total * 1e3);
  }
  return 0;
}
