// The kernels' thread count.
#include "opdispatch/parallel.h"

#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>

namespace opd {
namespace {

int default_threads() {
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

std::atomic<int>& threads() {
  static std::atomic<int> n{default_threads()};
  return n;
}

}  // namespace

int num_threads() { return threads().load(std::memory_order_relaxed); }

void set_num_threads(int n) {
  if (n < 1)
    throw std::invalid_argument("thread count must be >= 1, received " + std::to_string(n));
  threads().store(n);
}

bool have_openmp() {
#if defined(_OPENMP)
  return true;
#else
  return false;
#endif
}

}  // namespace opd
