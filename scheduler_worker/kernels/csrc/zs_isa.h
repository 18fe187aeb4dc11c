// The one kernel dispatch of every op (quant/qlinear.cpp's GEMMs, decode_attention.cpp,
// decode_ops.cpp, decode_model.cpp): an explicit `isa` argument, chosen once in Python
// (--kernels, ZEROSERVE_CPU_KIND: scheduler_worker/kernels) and clamped here to what the
// CPU has, so asking for AVX2 on an AVX-512 machine runs every op's AVX2 code. AMX is
// AVX-512 VNNI plus the tile unit (quant/arch/amx/amx.h): only some quantized linears differ on it,
// every other op runs its AVX-512 code.
//
// The float ops (attention, norms, activation, RoPE) are plain loops written for the
// vectorizer: each hot loop is an always-inline template compiled three times, into a
// portable (baseline x86-64) wrapper and two wrappers carrying the AVX2 and AVX-512
// target attributes (ZS_VARIANTS), and the op picks one by the clamped isa.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <bit>
#include <cstdint>

// The tile intrinsics came with GCC 11 and clang 12: an older compiler builds everything
// else, and best_isa (zs_isa.cpp) never answers AMX from its library (-DZS_HAVE_AMX=0 builds
// that way on any compiler).
#ifndef ZS_HAVE_AMX
#if defined(__clang__) ? __clang_major__ >= 12 : (defined(__GNUC__) && __GNUC__ >= 11)
#define ZS_HAVE_AMX 1
#else
#define ZS_HAVE_AMX 0
#endif
#endif

namespace zs_qgemm {
enum Isa : int64_t { SCALAR = 0, AVX2 = 1, AVX512 = 2, AMX = 3 };
int64_t best_isa();                // the fastest path this CPU (and the OS, for AMX) runs
int64_t clamp_isa(int64_t isa);    // isa limited to [SCALAR, best_isa()]
}  // namespace zs_qgemm

#define ZS_INLINE inline __attribute__((always_inline))
#define ZS_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define ZS_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

namespace zs_ops {

ZS_INLINE float f32(float x) { return x; }
ZS_INLINE float f32(c10::BFloat16 x) { return std::bit_cast<float>(static_cast<uint32_t>(x.x) << 16); }
ZS_INLINE float f32(c10::Half x) { return static_cast<float>(x); }

// fast_exp's clamp bounds as values the optimizer cannot see through (an empty asm, built
// once before a loop): with constant bounds GCC left the loops of fast_exp scalar on AVX2
// (a select it cannot make without masks) and on AVX-512 divided twice, once for the
// clamped lanes (docs/benchmarks.md, "AVX2 eight-row step, seventh session").
struct ExpRange {
  float lo = -87.f, hi = 88.f;
  ZS_INLINE ExpRange() { asm("" : "+x"(lo), "+x"(hi)); }
};

// exp(x), vectorizable: 2^n * p(r) with x = n ln2 + r, |r| <= ln2/2, p a degree-6 Taylor
// polynomial (relative error < 2e-7); x clamped to [-87, 88] (float's normal range). n is
// rounded by adding and subtracting 1.5 * 2^23 (floor() keeps GCC from vectorizing).
ZS_INLINE float fast_exp(float x, const ExpRange& range) {
  x = x < range.lo ? range.lo : x;
  x = x > range.hi ? range.hi : x;
  const float n = (x * 1.44269504f + 12582912.f) - 12582912.f;
  const float r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
  const float p = 1.f + r * (1.f + r * (0.5f + r * (0.16666667f + r * (0.041666668f + r * (0.008333334f + r * 0.0013888889f)))));
  return p * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
}

}  // namespace zs_ops

// Three wrappers NAME<ISA>(...) around the always-inline IMPL, one per path, and a pick:
//   ZS_VARIANTS((template <typename T>), rms_row, rms_row_impl<T>, (const T* x, int64_t n), (x, n))
// defines rms_row_0/_1/_2 (portable, AVX2, AVX-512); ZS_PICK(rms_row<T>, isa) selects one
// (AMX takes the AVX-512 one).
#define ZS_UNPAREN(...) __VA_ARGS__
#define ZS_VARIANTS(TEMPLATE, NAME, IMPL, PARAMS, ARGS)                       \
  ZS_UNPAREN TEMPLATE void NAME##_0 PARAMS { IMPL ARGS; }                     \
  ZS_UNPAREN TEMPLATE ZS_TARGET_AVX2 void NAME##_1 PARAMS { IMPL ARGS; }      \
  ZS_UNPAREN TEMPLATE ZS_TARGET_AVX512 void NAME##_2 PARAMS { IMPL ARGS; }
#define ZS_PICK(NAME, TARGS, ISA) \
  ((ISA) >= 2 ? &NAME##_2 ZS_UNPAREN TARGS : (ISA) == 1 ? &NAME##_1 ZS_UNPAREN TARGS : &NAME##_0 ZS_UNPAREN TARGS)
