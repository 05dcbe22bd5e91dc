// Threading: one configurable thread count for every kernel (OpenMP when available).
#pragma once

#include <cstdint>

#if OPD_HAVE_OPENMP || defined(_OPENMP)
#include <omp.h>
#endif

namespace opd {

// Threads used by kernels; defaults to every core the process may use.
int num_threads();

// Sets the thread count; n < 1 throws std::invalid_argument.
void set_num_threads(int n);

// Whether the build has OpenMP (without it kernels run on one thread).
bool have_openmp();

// How many chunks per thread parallel_chunks makes (when the grain allows): a thread that
// another process deschedules holds up only the chunk it is in, the others take the rest.
constexpr std::int64_t kChunksPerThread = 4;

// Runs fn(i) for i in [0, n) over num_threads() threads with a guided schedule: each thread
// takes runs of consecutive indices (large first, smaller towards the end) from a shared
// counter, so a thread that starts late or is descheduled by another process does not leave
// its static share for the others to wait on at the barrier.
template <class Fn>
inline void parallel_for(std::int64_t n, Fn&& fn) {
#if defined(_OPENMP)
  const int nt = num_threads();
  if (nt > 1 && n > 1) {
#pragma omp parallel for num_threads(nt) schedule(guided)
    for (std::int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
#endif
  for (std::int64_t i = 0; i < n; ++i) fn(i);
}

// Runs fn(begin, end) over contiguous chunks of [0, n), at least `grain` items per chunk and
// up to kChunksPerThread chunks per thread, taken dynamically (see parallel_for).
template <class Fn>
inline void parallel_chunks(std::int64_t n, std::int64_t grain, Fn&& fn) {
  if (n <= 0) return;
  std::int64_t chunks = 1;
#if defined(_OPENMP)
  const int nt = num_threads();
  chunks = n / (grain > 0 ? grain : 1);
  if (nt <= 1) chunks = 1;
  if (chunks > nt * kChunksPerThread) chunks = nt * kChunksPerThread;
  if (chunks < 1) chunks = 1;
#endif
  const std::int64_t step = (n + chunks - 1) / chunks;
  parallel_for(chunks, [&](std::int64_t c) {
    const std::int64_t b = c * step;
    const std::int64_t e = b + step < n ? b + step : n;
    if (b < e) fn(b, e);
  });
}

}  // namespace opd
