// llama.cpp's CPU mul_mat for one linear, TYPE N K at M activation rows, on one thread: a
// ggml graph of one ggml_mul_mat (what llama-server runs for a prompt's linears: llamafile's
// tinyBLAS where it takes the type, Q8_0 / Q4_0 / Q5_0 / IQ4_NL on AVX2, else vec_dot row by
// row; the repacked CPU_REPACK buffers, Q4_0 / Q4_K / IQ4_NL on AVX2, are not used here),
// the activations float32 as llama.cpp quantizes them per call. Thread-CPU ms, min and
// median of R calls. Built against a llama.cpp build's static ggml libraries, as
// step_linears.cpp (docs/benchmarks.md, "AVX2 prefill and the 8-stream ratio (issue 56),
// tenth session"):
//   g++ -O3 -std=c++17 -fopenmp -o /tmp/llama_mul_mat benchmarks/comparison/llama_mul_mat.cpp
//      -I$LLAMA/ggml/include $LLAMA/build-avx2/ggml/src/libggml-cpu.a
//      $LLAMA/build-avx2/ggml/src/libggml-base.a -lpthread -lm   (one command line)
//   /tmp/llama_mul_mat q5_0 1536 576 128 [R]
#include <ggml.h>
#include <ggml-cpu.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <strings.h>
#include <ctime>
#include <random>
#include <string>
#include <vector>
#include <algorithm>
static double now() { timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
int main(int argc, char** argv) {
  const char* tn = argv[1]; int64_t N = atoll(argv[2]), K = atoll(argv[3]), M = atoll(argv[4]); int R = argc > 5 ? atoi(argv[5]) : 20;
  ggml_type t = GGML_TYPE_COUNT;  // by name, any case (q5_0, Q4_K)
  for (int i = 0; i < GGML_TYPE_COUNT; ++i)
    if (ggml_type_name((ggml_type)i) && strcasecmp(ggml_type_name((ggml_type)i), tn) == 0) t = (ggml_type)i;
  if (t == GGML_TYPE_COUNT) { fprintf(stderr, "unknown type %s\n", tn); return 1; }
  ggml_init_params ip = {(size_t)1 << 30, nullptr, false};
  ggml_context* ctx = ggml_init(ip);
  ggml_tensor* w = ggml_new_tensor_2d(ctx, t, K, N);
  ggml_tensor* x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, M);
  std::mt19937 g(1); std::normal_distribution<float> nd(0, 0.02f);
  std::vector<float> wf(N * K); for (auto& v : wf) v = nd(g);
  ggml_quantize_chunk(t, wf.data(), w->data, 0, N, K, nullptr);
  for (int64_t i = 0; i < K * M; ++i) ((float*)x->data)[i] = nd(g) * 50;
  ggml_tensor* y = ggml_mul_mat(ctx, w, x);
  ggml_cgraph* gf = ggml_new_graph(ctx);
  ggml_build_forward_expand(gf, y);
  for (int i = 0; i < 3; ++i) ggml_graph_compute_with_ctx(ctx, gf, 1);
  std::vector<double> ts;
  for (int r = 0; r < R; ++r) { double t0 = now(); ggml_graph_compute_with_ctx(ctx, gf, 1); ts.push_back((now() - t0) * 1e3); }
  std::sort(ts.begin(), ts.end());
  printf("llama %s %lldx%lld M=%lld: min %.3f med %.3f ms  %.1f GMAC/s\n", tn, (long long)N, (long long)K, (long long)M, ts[0], ts[R / 2], N * K * M / ts[0] / 1e6);
}
