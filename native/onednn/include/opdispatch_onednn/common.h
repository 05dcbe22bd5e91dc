// Shared pieces of the oneDNN backend: the CPU engine, a stream per thread, the thread count,
// memory-format tags by name, and memory-descriptor helpers. No pybind11 here: bindings turn
// std::invalid_argument into ValueError and std::runtime_error into RuntimeError.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <unordered_map>
#include <string>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"

namespace opd::onednn {

using i64 = std::int64_t;
using Dims = std::vector<i64>;
using dnnl::memory;

// The CPU engine every primitive is created on (one per process).
const dnnl::engine& engine();

// This thread's stream (created on first use, then reused by every execution on the thread).
dnnl::stream& stream();

// Threads oneDNN's OpenMP runtime uses for our primitives; 0 = the runtime's default.
int num_threads();
void set_num_threads(int n);
// Applies the configured thread count to the calling thread (OpenMP's nthreads is per thread).
void apply_threads();

// (major, minor, patch) of the oneDNN library loaded at run time, and its commit hash.
std::vector<int> library_version();
std::string library_hash();
// oneDNN's effective instruction set on this CPU ("avx512_core", "avx2", ...).
std::string effective_isa();
// The CPU threading runtime oneDNN was built with ("omp", "tbb", "seq", "threadpool").
std::string cpu_runtime();

// Format tags known by name ("abcd", "aBcd16b", "ABcd16b16a", ...): the formats oneDNN picks
// for f32 on x86 CPUs. tag_from_name throws std::invalid_argument for an unknown name.
memory::format_tag tag_from_name(const std::string& name);
bool is_known_tag(const std::string& name);
std::vector<std::string> known_tags(int rank);  // rank 0: all

// An f32 memory descriptor of `dims` in format `tag` (validated: rank and dims >= 1).
memory::desc make_md(const Dims& dims, const std::string& tag);
// The name of the known tag that describes `md` exactly, or "" when none does.
std::string tag_of(const memory::desc& md);
// A readable description of `md` (dims, padded dims, stride order, inner blocks) for errors.
std::string describe(const memory::desc& md);
// The shape of the array that holds `md`'s buffer: outer (padded / blocked) dims in memory
// order, then the inner blocks; its element count equals md.get_size() / 4.
Dims physical_shape(const memory::desc& md);
// The same for `md` created from (or equal to) format `tag`, laid out in the tag's own order:
// oneDNN treats the strides of size-1 dims as free, so one memory can match several tags, and
// the array shape follows the tag that names the layout.
Dims physical_shape(const memory::desc& md, const std::string& tag);
i64 elements(const Dims& shape);
std::string dims_str(const Dims& d);

// Executes `prim` on this thread's stream with the configured threads and waits.
void execute(const dnnl::primitive& prim, const std::unordered_map<int, memory>& args);

// A 64-byte aligned float buffer (packed weights, scratch), zero-initialised.
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(i64 n);
  float* data() const { return ptr_.get(); }
  i64 size() const { return n_; }
  bool empty() const { return n_ == 0; }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> ptr_;
  i64 n_ = 0;
};

// A memory object over a caller's buffer (never copied; the caller keeps it alive).
memory wrap(const memory::desc& md, const void* data);

}  // namespace opd::onednn
