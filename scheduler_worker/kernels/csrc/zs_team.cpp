// The team of a decode step (zs_team.h).
#include "zs_team.h"

#include <immintrin.h>
#include <omp.h>
#include <sched.h>

#ifdef ZS_TEAM_STATS
#include <x86intrin.h>

#include <cstdio>
#endif

namespace zs_team {
namespace {

thread_local Team* tls_team = nullptr;

#ifdef ZS_TEAM_STATS  // a measuring build only (docs/benchmarks.md, "Two threads in the decode step")
struct Stats {
  uint64_t steps = 0, tasks = 0, region = 0, caller_work = 0, caller_wait = 0, helper_work = 0;
  ~Stats() {
    if (steps)
      std::fprintf(stderr, "zs_team: %llu steps, %.1f tasks a step; Mcycles a step: region %.3f, caller's chunks %.3f, "
                   "caller waiting %.3f, helpers' chunks %.3f\n", (unsigned long long)steps, double(tasks) / steps,
                   region / 1e6 / steps, caller_work / 1e6 / steps, caller_wait / 1e6 / steps, helper_work / 1e6 / steps);
  }
} stats;
#define ZS_STAT(x) x
#else
#define ZS_STAT(x)
#endif

// One turn of a wait: a pause, and past ~100 us of them the CPU yielded (a machine with
// more runnable threads than CPUs: the thread waited on may be the one descheduled).
inline void relax(int64_t& spins) {
  if (++spins < 4096) _mm_pause();
  else sched_yield();
}

}  // namespace

Team* current() { return tls_team; }

void Team::run(Fn f, const void* ctx, int64_t b, int64_t e, int64_t chunk) {
  fn_ = f, ctx_ = ctx, begin_ = b, end_ = e, chunk_ = chunk;
  pending_.store(size_ - 1, std::memory_order_relaxed);  // every helper answers, idle or not
  gen_.fetch_add(1, std::memory_order_release);
  std::exception_ptr mine;
  ZS_STAT(const uint64_t t0 = __rdtsc());
  try {
    f(ctx, b, std::min(e, b + chunk));
  } catch (...) {
    mine = std::current_exception();
  }
  ZS_STAT(const uint64_t t1 = __rdtsc());
  for (int64_t spins = 0; pending_.load(std::memory_order_acquire) != 0;) relax(spins);
  ZS_STAT(stats.tasks++; stats.caller_work += t1 - t0; stats.caller_wait += __rdtsc() - t1);
  if (mine) std::rethrow_exception(mine);
  if (error_) {
    std::exception_ptr theirs = error_;
    error_ = nullptr;
    error_set_.clear();
    std::rethrow_exception(theirs);
  }
}

void Team::serve(int64_t tid) {
  for (uint64_t seen = 0;;) {
    uint64_t g;
    for (int64_t spins = 0; (g = gen_.load(std::memory_order_acquire)) == seen;) relax(spins);
    seen = g;
    if (stopping_) return;
    const int64_t b = begin_ + tid * chunk_;
    if (b < end_) {
      ZS_STAT(const uint64_t t0 = __rdtsc());
      try {
        fn_(ctx_, b, std::min(end_, b + chunk_));
      } catch (...) {
        if (!error_set_.test_and_set()) error_ = std::current_exception();
      }
      ZS_STAT(stats.helper_work += __rdtsc() - t0);  // one helper in the measured runs
    }
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void Team::stop() {
  stopping_ = true;
  gen_.fetch_add(1, std::memory_order_release);
}

void with_team(const std::function<void()>& step) {
  if (tls_team != nullptr || at::in_parallel_region() || at::get_num_threads() < 2) return step();
  Team team;
  std::exception_ptr error;
  // no num_threads clause: torch's own regions avoid it (libgomp's pool, pytorch#32008);
  // the team is whatever threads the region has
#pragma omp parallel
  {
    if (omp_get_thread_num() == 0) {
      team.set_size(omp_get_num_threads());
      tls_team = &team;
      ZS_STAT(const uint64_t t0 = __rdtsc());
      try {
        step();
      } catch (...) {
        error = std::current_exception();
      }
      ZS_STAT(stats.steps++; stats.region += __rdtsc() - t0);
      tls_team = nullptr;
      team.stop();
    } else {
      team.serve(omp_get_thread_num());
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace zs_team
