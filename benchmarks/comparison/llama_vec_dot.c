// llama.cpp's vec_dot per weight byte: M activation rows quantized (its from_float) and
// dotted with every row of an N x K weight, one thread, the fastest of 300 calls: what
// `bench_quant.py --per-byte ... --threads 1 --min-of 300` measures of ours. Built against a
// llama.cpp build's static ggml libraries (never part of install or CI; nothing of llama.cpp
// is committed), docs/benchmarks.md "Every CPU kind":
//   cc -O2 -o /tmp/llama_vec_dot benchmarks/comparison/llama_vec_dot.c -I$LLAMA/ggml/include \
//      $LLAMA/build-avx2/ggml/src/libggml-cpu.a $LLAMA/build-avx2/ggml/src/libggml-base.a \
//      -fopenmp -lm -lstdc++ -lpthread
//   /tmp/llama_vec_dot Q4_1,Q5_0,Q5_1,Q8_0,Q4_K,Q6_K 2048 1024 8   # types N K M
// Q4_K on a repacking build also has a repacked gemv/gemm (ggml-cpu/repack.cpp), not timed.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "ggml.h"
#include "ggml-cpu.h"
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char** argv) {
  ggml_cpu_init();
  const int N = atoi(argv[2]), K = atoi(argv[3]), M = argc > 4 ? atoi(argv[4]) : 1;
  enum ggml_type types[] = {GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K};
  const char* names[] = {"Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q6_K"};
  float* w = malloc(sizeof(float) * N * K); float* x = malloc(sizeof(float) * K * M);
  for (long i = 0; i < (long)N * K; ++i) w[i] = (rand() / (float)RAND_MAX - 0.5f) * 0.1f;
  for (long i = 0; i < (long)K * M; ++i) x[i] = rand() / (float)RAND_MAX - 0.5f;
  for (int t = 0; t < 6; ++t) {
    if (strstr(argv[1], names[t]) == NULL) continue;
    enum ggml_type ty = types[t];
    const struct ggml_type_traits_cpu* tr = ggml_get_type_traits_cpu(ty);
    size_t rb = ggml_row_size(ty, K);
    void* q = malloc(rb * N);
    ggml_quantize_chunk(ty, w, q, 0, N, K, NULL);
    const struct ggml_type_traits_cpu* xt = ggml_get_type_traits_cpu(tr->vec_dot_type);
    size_t xrb = ggml_row_size(tr->vec_dot_type, K);
    void* xq = malloc(xrb * M);
    float* out = malloc(sizeof(float) * N * M);
    double best = 1e9;
    for (int r = 0; r < 300; ++r) {
      double t0 = now();
      for (int m = 0; m < M; ++m) xt->from_float(x + (long)m * K, (char*)xq + m * xrb, K);
      for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) tr->vec_dot(K, out + (long)m * N + n, 0, (char*)q + n * rb, 0, (char*)xq + m * xrb, 0, 1);
      double dt = now() - t0; if (dt < best) best = dt;
    }
    printf("llama.cpp %s %dx%d M=%d: %.3f ns/byte (%.1f us)\n", names[t], N, K, M, best * 1e9 / (rb * N), best * 1e6);
  }
  return 0;
}
