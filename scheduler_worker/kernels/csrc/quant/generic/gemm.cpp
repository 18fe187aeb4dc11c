// The portable reference of every format (layouts and math: ../formats.h): one output at a
// time, read from the packed layout by the format's row (FORMAT_ROWS) with plain integer
// and float arithmetic, compiled for baseline x86-64. It serves every (format, ISA) pair
// the table of qlinear.cpp has no kernel for, and the SIMD kernels are tested against it
// (tests/scheduler_worker).
#include <cmath>

#include "../kernel.h"

namespace zs_qgemm::generic {

template <typename T>
static void quantize_row(const T* x, int64_t nb, int8_t* q, float* d, float* s) {
  for (int64_t b = 0; b < nb; ++b) {
    float amax = 0.f;
    for (int j = 0; j < QK; ++j) amax = std::max(amax, std::fabs(static_cast<float>(x[b * QK + j])));
    const float db = amax / 127.f;
    const float id = db > 0.f ? 1.f / db : 0.f;
    int sum = 0;
    for (int j = 0; j < QK; ++j) {
      const int v = static_cast<int>(std::nearbyint(static_cast<float>(x[b * QK + j]) * id));
      q[b * QK + j] = static_cast<int8_t>(v);
      sum += v;
    }
    d[b] = db;
    s[b] = db * static_cast<float>(sum);
  }
}

void quantize(const void* x, bool bf16, int64_t nb, int8_t* q, float* d, float* s) {
  if (bf16) quantize_row(static_cast<const c10::BFloat16*>(x), nb, q, d, s);
  else quantize_row(static_cast<const float*>(x), nb, q, d, s);
}

// The dots of row r's values in block qb with the activations xb, per half: s0 over the
// inputs below 16, s1 over those above (formats.h: register k holds inputs 4k + j and
// 16 + 4k + j of each row in byte j; 8 bits: inputs 4k + j in register k < 8).
template <int FMT>
static inline void half_dots(const uint8_t* qb, int64_t r, const int8_t* xb, int32_t& s0, int32_t& s1) {
  constexpr FormatRow R = FORMAT_ROWS[FMT];
  constexpr int OFF = static_cast<int>(R.offset);
  const uint8_t* q = qb + r * 4;
  s0 = s1 = 0;
  for (int k = 0; k < 4; ++k)
    for (int j = 0; j < 4; ++j) {
      int a, c;
      if constexpr (R.bits == 8) {
        a = q[k * 64 + j], c = q[(k + 4) * 64 + j];
      } else {
        const int v = q[k * 64 + j];
        a = v & 15, c = v >> 4;
        if constexpr (R.bits == 5) {
          const int h = q[256 + j];
          a |= ((h >> (2 * k)) & 1) << 4, c |= ((h >> (2 * k + 1)) & 1) << 4;
        }
        if constexpr (R.bits == 6) a |= ((q[256 + j] >> (2 * k)) & 3) << 4, c |= ((q[320 + j] >> (2 * k)) & 3) << 4;
      }
      if constexpr (R.codebook != nullptr) a = R.codebook[a], c = R.codebook[c];
      s0 += (a - OFF) * xb[4 * k + j], s1 += (c - OFF) * xb[16 + 4 * k + j];
    }
}

// out[i, n] = sum over blocks b, pieces p: dx dw_p dot(v_p, qx_p) + mw sx (a piece of 16:
// the inputs below 16, then those above).
template <int FMT>
static float dot(const Act& x, const Packed& w, int64_t i, int64_t n) {
  using L = Layout<FMT>;
  constexpr FormatRow R = L::R;
  static_assert(R.piece == QK || R.piece == QK / 2, "pieces of 32 or 16 inputs");
  const int64_t g = n / GR, r = n % GR;
  float acc = 0.f;
  for (int64_t b = 0; b < w.nb; ++b) {
    const uint8_t* qb = sub_block<FMT>(w, g, b);
    const int8_t* xb = x.q + (i * w.nb + b) * QK;
    int32_t s0, s1;
    half_dots<FMT>(qb, r, xb, s0, s1);
    const int64_t u = unit_of<FMT>(w, g, b) * scale_stride<FMT>(w) + r;
    const float d = static_cast<float>(w.d[u]), dx = x.d[i * w.nb + b];
    const uint8_t* sc = nullptr;
    if constexpr (R.scale != Scale::D) sc = block_scales<FMT>(w, g, b);
    auto dw = [&](int p) {  // piece p's
      if constexpr (R.scale == Scale::D_SC_U8) return d * static_cast<float>(sc[r]);
      if constexpr (R.scale == Scale::D_SC_I8) return d * static_cast<float>(static_cast<int8_t>(sc[p * GR + r]));
      return d;
    };
    if constexpr (R.piece == QK) acc += dw(0) * dx * static_cast<float>(s0 + s1);
    else acc += (dw(0) * static_cast<float>(s0) + dw(1) * static_cast<float>(s1)) * dx;
    if constexpr (R.min == Min::M) acc += static_cast<float>(w.m[u]) * x.s[i * w.nb + b];
    if constexpr (R.min == Min::M_MN)
      acc += static_cast<float>(w.m[u]) * static_cast<float>(sc[L::UK * GR + r]) * x.s[i * w.nb + b];
  }
  return acc;
}

template <int FMT>
void groups(const Act& x, const Packed& w, int64_t M, Out out, int64_t g0, int64_t g1) {
  with_out(out, [&](auto* o) {
    for (int64_t n = g0 * GR; n < std::min(w.N, g1 * GR); ++n)
      for (int64_t i = 0; i < M; ++i) store(o + i * w.N + n, dot<FMT>(x, w, i, n));
  });
}

template <int... F>
constexpr std::array<GroupsFn, NFMT> every(std::integer_sequence<int, F...>) {
  return {&groups<F>...};
}
// every format's, by its code: a format with a row has its portable kernel
extern const std::array<GroupsFn, NFMT> EVERY = every(std::make_integer_sequence<int, NFMT>{});

}  // namespace zs_qgemm::generic
