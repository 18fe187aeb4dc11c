// Which kernel path this CPU runs (zs_isa.h): detected once per process, and every op's
// `isa` argument clamped to it.
#include <sys/syscall.h>
#include <unistd.h>

#include <cpuid.h>

#include <algorithm>

#include "zs_isa.h"

namespace zs_qgemm {

// AMX-TILE and AMX-INT8 (CPUID leaf 7, EDX bits 24 and 25), and Linux's permission to
// use the tile data: asked once for the whole process (arch_prctl ARCH_REQ_XCOMP_PERM,
// XFEATURE_XTILEDATA; Linux 5.16+), refused on older kernels or where a VM hides it.
static bool amx_usable() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((d >> 24) & 1) || !((d >> 25) & 1)) return false;
  return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}

static int64_t detect_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vnni"))
    return ZS_HAVE_AMX && amx_usable() ? AMX : AVX512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
    return AVX2;
  return SCALAR;
}

int64_t best_isa() {
  static const int64_t best = detect_isa();  // every op clamps its isa: one syscall, at the first
  return best;
}

int64_t clamp_isa(int64_t isa) { return std::min(std::max<int64_t>(isa, SCALAR), best_isa()); }

}  // namespace zs_qgemm
