// The portable reference of every format (layouts and math: ../formats.h): one output at a
// time, read from the packed layout with plain integer and float arithmetic, compiled for
// baseline x86-64. It serves every (format, ISA) pair the table of qlinear.cpp has no
// kernel for, and the SIMD kernels are tested against it (tests/scheduler_worker).
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

// Q4 / Q8: sum_b d dx dot(q, qx) (+ m sx for Q4).
template <int FMT>
static float dot_block_format(const Act& x, const Packed& w, int64_t i, int64_t n) {
  constexpr int64_t BB = Layout<FMT>::SBB;
  const int64_t g = n / GR, r = n % GR;
  float acc = 0.f;
  for (int64_t b = 0; b < w.nb; ++b) {
    const uint8_t* qb = w.q + (g * w.nb + b) * BB + r * 4;
    const int8_t* xb = x.q + (i * w.nb + b) * QK;
    int32_t sum = 0;
    for (int64_t k = 0; k < BB / 64; ++k)
      for (int64_t j = 0; j < 4; ++j) {
        const int v = qb[k * 64 + j];
        if constexpr (FMT == Q4) sum += (v & 15) * xb[4 * k + j] + (v >> 4) * xb[16 + 4 * k + j];
        else sum += (v - 128) * xb[4 * k + j];
      }
    const int64_t at = (g * w.nb + b) * GR + r;
    acc += static_cast<float>(w.d[at]) * x.d[i * w.nb + b] * static_cast<float>(sum);
    if constexpr (FMT == Q4) acc += static_cast<float>(w.m[at]) * x.s[i * w.nb + b];
  }
  return acc;
}

// Q5, Q50, Q4K, Q5K: the nibbles with their fifth bits, scaled per block.
template <int FMT>
static float dot_kquant(const Act& x, const Packed& w, int64_t i, int64_t n) {
  using L = Layout<FMT>;
  const int64_t g = n / GR, r = n % GR;
  float acc = 0.f;
  for (int64_t b = 0; b < w.nb; ++b) {
    const uint8_t* qb = sub_block<FMT>(w, g, b);
    const int8_t* xb = x.q + (i * w.nb + b) * QK;
    int32_t sum = 0;
    for (int k = 0; k < 4; ++k)
      for (int j = 0; j < 4; ++j) {
        const int v = qb[k * 64 + r * 4 + j];
        int lo = v & 15, hi = v >> 4;
        if constexpr (L::HI) {
          const int h = qb[256 + r * 4 + j];
          lo |= ((h >> (2 * k)) & 1) << 4;
          hi |= ((h >> (2 * k + 1)) & 1) << 4;
        }
        sum += lo * xb[4 * k + j] + hi * xb[16 + 4 * k + j];
      }
    float dw, mw;
    if constexpr (L::SUPER) {
      const int64_t u = unit_of<FMT>(w, g, b) * GR + r;
      const uint8_t* sc = block_scales<FMT>(w, g, b);
      dw = static_cast<float>(w.d[u]) * static_cast<float>(sc[r]);
      mw = static_cast<float>(w.m[u]) * static_cast<float>(sc[128 + r]);
    } else {
      dw = static_cast<float>(w.d[(g * w.nb + b) * GR + r]);
      mw = L::M ? static_cast<float>(w.m[(g * w.nb + b) * GR + r]) : -16.f * dw;
    }
    acc += dw * x.d[i * w.nb + b] * static_cast<float>(sum);
    acc += mw * x.s[i * w.nb + b];
  }
  return acc;
}

// Q6K: per piece of 16, (sum q x - 32 sum x) d sc, per block times dx.
static float dot_q6k(const Act& x, const Packed& w, int64_t i, int64_t n) {
  const int64_t g = n / GR, r = n % GR, nb = w.nb;
  float acc = 0.f, dv = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    if (b % 8 == 0) dv = static_cast<float>(w.d[unit_of<Q6K>(w, g, b) * GR + r]);
    const uint8_t* qb = sub_block<Q6K>(w, g, b);
    const int8_t* sc = reinterpret_cast<const int8_t*>(block_scales<Q6K>(w, g, b));
    const int8_t* xb = x.q + (i * nb + b) * QK;
    float t = 0.f;
    for (int p = 0; p < 2; ++p) {
      int32_t s = x.off[(i * nb + b) * 2 + p];
      const uint8_t* hb = qb + 256 + 64 * p + 4 * r;
      for (int k = 0; k < 4; ++k)
        for (int j = 0; j < 4; ++j) {
          const int v = qb[64 * k + 4 * r + j];
          const int q = (p ? v >> 4 : v & 15) | ((hb[j] >> (2 * k)) & 3) << 4;
          s += q * xb[16 * p + 4 * k + j];
        }
      t += static_cast<float>(s) * (dv * static_cast<float>(sc[16 * p + r]));
    }
    acc += t * x.d[i * nb + b];
  }
  return acc;
}

template <int FMT>
void groups(const Act& x, const Packed& w, int64_t M, Out out, int64_t g0, int64_t g1) {
  with_out(out, [&](auto* o) {
    for (int64_t n = g0 * GR; n < std::min(w.N, g1 * GR); ++n)
      for (int64_t i = 0; i < M; ++i) {
        float v;
        if constexpr (FMT == Q4 || FMT == Q8) v = dot_block_format<FMT>(x, w, i, n);
        else if constexpr (FMT == Q6K) v = dot_q6k(x, w, i, n);
        else v = dot_kquant<FMT>(x, w, i, n);
        store(o + i * w.N + n, v);
      }
  });
}

ZS_INSTANTIATE_GROUPS_OF_EVERY_FORMAT

}  // namespace zs_qgemm::generic
