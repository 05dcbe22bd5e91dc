// Engine, streams, threads, format tags and memory-descriptor helpers of the oneDNN backend.
#include "opdispatch_onednn/common.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <numeric>
#include <sstream>
#include <stdexcept>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "opdispatch_onednn/compat.h"

namespace opd::onednn {

const dnnl::engine& engine() {
  static const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

dnnl::stream& stream() {
  thread_local dnnl::stream s(engine());
  return s;
}

namespace {
std::atomic<int>& thread_setting() {
  static std::atomic<int> n{0};
  return n;
}
}  // namespace

int num_threads() {
  const int n = thread_setting().load(std::memory_order_relaxed);
#if defined(_OPENMP)
  return n > 0 ? n : omp_get_max_threads();
#else
  return n > 0 ? n : 1;
#endif
}

void set_num_threads(int n) {
  if (n < 0)
    throw std::invalid_argument("thread count must be >= 1 (or 0 for the default), received " +
                                std::to_string(n));
  thread_setting().store(n);
}

void apply_threads() {
#if defined(_OPENMP)
  const int n = thread_setting().load(std::memory_order_relaxed);
  if (n > 0 && omp_get_max_threads() != n) omp_set_num_threads(n);
#endif
}

std::vector<int> library_version() {
  const dnnl_version_t* v = dnnl_version();
  return {v->major, v->minor, v->patch};
}

std::string library_hash() { return dnnl_version()->hash ? dnnl_version()->hash : ""; }

std::string effective_isa() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
#if DNNL_VERSION_MAJOR >= 3
    case dnnl::cpu_isa::avx2_vnni_2: return "avx2_vnni_2";
    case dnnl::cpu_isa::avx512_core_fp16: return "avx512_core_fp16";
    case dnnl::cpu_isa::avx512_core_amx_fp16: return "avx512_core_amx_fp16";
#endif
    default: return "other (" + std::to_string(static_cast<int>(dnnl::get_effective_cpu_isa())) + ")";
  }
}

std::string cpu_runtime() {
#if DNNL_CPU_RUNTIME == DNNL_RUNTIME_OMP
  return "omp";
#elif DNNL_CPU_RUNTIME == DNNL_RUNTIME_TBB
  return "tbb";
#elif DNNL_CPU_RUNTIME == DNNL_RUNTIME_SEQ
  return "seq";
#elif defined(DNNL_RUNTIME_THREADPOOL) && DNNL_CPU_RUNTIME == DNNL_RUNTIME_THREADPOOL
  return "threadpool";
#else
  return "other";
#endif
}

// -- format tags ----------------------------------------------------------------------------

namespace {

using tag = memory::format_tag;

// Every tag this backend can name: plain orders and the blocked formats oneDNN's x86 f32
// primitives pick (activations blocked by 4/8/16 channels; conv weights blocked by 4/8/16
// in and out channels, or out channels only; grouped/depthwise weights; matmul weights).
#define OPD_TAGS(X)                                                                              \
  X(a) X(ab) X(ba) X(abc) X(acb) X(bac) X(abcd) X(acdb) X(bacd) X(bcda) X(cdba) X(abcde)       \
  X(acdeb) X(bcdea) X(cdeba) X(decab)                                                            \
  X(aBcd4b) X(aBcd8b) X(aBcd16b) X(Abcd4a) X(Abcd8a) X(Abcd16a) X(Acdb4a) X(Acdb8a) X(Acdb16a)   \
  X(Acdb32a) X(Acdb48a) X(Acdb64a) X(decbA16a)                                                   \
  X(ABcd4a4b) X(ABcd4b4a) X(ABcd8a8b) X(ABcd8b8a) X(ABcd16a16b) X(ABcd16b16a) X(ABcd16b32a)     \
  X(ABcd16b64a) X(BAcd16a16b) X(BAcd16b16a) X(ABcd8a4b) X(ABcd8b16a2b)                           \
  X(aBcde4b) X(aBcde8b) X(aBcde16b) X(Abcde4a) X(Abcde8a) X(Abcde16a) X(Acdeb4a) X(Acdeb8a)      \
  X(Acdeb16a) X(aBCde4b4c) X(aBCde4c4b) X(aBCde8b8c) X(aBCde8c8b) X(aBCde16b16c) X(aBCde16c16b)  \
  X(aBdec4b) X(aBdec8b) X(aBdec16b) X(aCBde16b16c) X(aCBde16c16b)                                \
  X(AB16b16a) X(AB16b32a) X(AB16b64a) X(BA16a16b) X(BA16a32b) X(BA16a48b) X(BA16a64b)            \
  X(aBc4b) X(aBc8b) X(aBc16b) X(ABc16b16a) X(ABc16a16b)

// Formats that only oneDNN 3.x names: the AVX2 brgemm convolution's weights, out channels
// blocked by 24 (three 8-float vectors), and its depthwise weights blocked by 8.
#if DNNL_VERSION_MAJOR >= 3
#define OPD_TAGS_3X(X) X(Acdb24a) X(decbA8a)
#else
#define OPD_TAGS_3X(X)
#endif

const std::map<std::string, tag>& tag_table() {
  static const std::map<std::string, tag> table = {
#define OPD_TAG_ENTRY(t) {#t, tag::t},
      OPD_TAGS(OPD_TAG_ENTRY)
      OPD_TAGS_3X(OPD_TAG_ENTRY)
#undef OPD_TAG_ENTRY
  };
  return table;
}

// The rank a tag describes: its distinct letters (blocks such as "16b" repeat one).
int tag_rank(const std::string& name) {
  std::string letters;
  for (char ch : name)
    if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'))
      letters += static_cast<char>(ch | 0x20);
  std::sort(letters.begin(), letters.end());
  letters.erase(std::unique(letters.begin(), letters.end()), letters.end());
  return static_cast<int>(letters.size());
}

}  // namespace

memory::format_tag tag_from_name(const std::string& name) {
  const auto& t = tag_table();
  auto it = t.find(name);
  if (it == t.end()) {
    std::string known;
    for (const auto& kv : t) known += (known.empty() ? "" : ", ") + kv.first;
    throw std::invalid_argument("unknown oneDNN format tag '" + name + "'; known tags: " + known);
  }
  return it->second;
}

bool is_known_tag(const std::string& name) { return tag_table().count(name) > 0; }

std::vector<std::string> known_tags(int rank) {
  std::vector<std::string> out;
  for (const auto& kv : tag_table())
    if (rank == 0 || tag_rank(kv.first) == rank) out.push_back(kv.first);
  return out;
}

std::string dims_str(const Dims& d) {
  std::string s = "(";
  for (std::size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + (d.size() == 1 ? ",)" : ")");
}

memory::desc make_md(const Dims& dims, const std::string& name) {
  const tag t = tag_from_name(name);
  const int rank = tag_rank(name);
  if (static_cast<int>(dims.size()) != rank)
    throw std::invalid_argument("format tag '" + name + "' describes rank-" +
                                std::to_string(rank) + " tensors, received dims " +
                                dims_str(dims));
  for (auto d : dims)
    if (d < 1) throw std::invalid_argument("tensor dims must be >= 1, received " + dims_str(dims));
  return memory::desc(memory::dims(dims.begin(), dims.end()), memory::data_type::f32, t);
}

std::string tag_of(const memory::desc& md) {
  if (!compat::is_blocked(md)) return "";
  const Dims d = compat::dims(md);
  for (const auto& kv : tag_table()) {
    if (tag_rank(kv.first) != static_cast<int>(d.size())) continue;
    memory::desc probe(memory::dims(d.begin(), d.end()), memory::data_type::f32, kv.second);
    if (probe == md) return kv.first;
  }
  return "";
}

namespace {
// Outer dims in memory order (largest stride first; ties keep the lower dim first).
std::vector<int> outer_order(const Dims& strides) {
  std::vector<int> order(strides.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return strides[a] > strides[b]; });
  return order;
}
}  // namespace

std::string describe(const memory::desc& md) {
  std::ostringstream os;
  os << "dims " << dims_str(compat::dims(md));
  if (!compat::is_blocked(md)) return os.str() + " in a non-blocked format";
  Dims strides, blks, idxs;
  compat::blocking(md, strides, blks, idxs);
  os << ", padded " << dims_str(compat::padded_dims(md)) << ", order ";
  for (int i : outer_order(strides)) os << static_cast<char>('a' + i);
  for (std::size_t k = 0; k < blks.size(); ++k) os << blks[k] << static_cast<char>('a' + idxs[k]);
  return os.str();
}

namespace {

// The physical shape of `dims` (padded) in the format named `tag`: the outer letters in the
// tag's order, each dim divided by its blocks, then the inner blocks in the tag's order. The
// tag's own order settles dims whose strides tie (dims of size 1).
Dims tag_shape(const Dims& dims, const Dims& padded, const std::string& tag) {
  std::size_t k = 0;
  std::string outer;
  while (k < tag.size() && !(tag[k] >= '0' && tag[k] <= '9')) outer += tag[k++];
  Dims block_of(dims.size(), 1), blocks;
  while (k < tag.size()) {
    i64 b = 0;
    while (k < tag.size() && tag[k] >= '0' && tag[k] <= '9') b = b * 10 + (tag[k++] - '0');
    const int d = (tag[k++] | 0x20) - 'a';
    block_of[d] *= b;
    blocks.push_back(b);
  }
  Dims shape;
  for (char ch : outer) {
    const int d = (ch | 0x20) - 'a';
    shape.push_back(padded[d] / block_of[d]);
  }
  shape.insert(shape.end(), blocks.begin(), blocks.end());
  return shape;
}

}  // namespace

Dims physical_shape(const memory::desc& md, const std::string& tag) {
  if (!compat::is_blocked(md))
    throw std::invalid_argument("memory format is not a blocked one: " + describe(md));
  return tag_shape(compat::dims(md), compat::padded_dims(md), tag);
}

Dims physical_shape(const memory::desc& md) {
  if (!compat::is_blocked(md))
    throw std::invalid_argument("memory format is not a blocked one: " + describe(md));
  const std::string tag = tag_of(md);
  if (!tag.empty()) return tag_shape(compat::dims(md), compat::padded_dims(md), tag);
  Dims strides, blks, idxs;
  compat::blocking(md, strides, blks, idxs);
  const Dims padded = compat::padded_dims(md);
  Dims block_of(padded.size(), 1);
  for (std::size_t k = 0; k < blks.size(); ++k) block_of[idxs[k]] *= blks[k];
  Dims shape;
  for (int i : outer_order(strides)) shape.push_back(padded[i] / block_of[i]);
  for (auto b : blks) shape.push_back(b);
  return shape;
}

i64 elements(const Dims& shape) {
  i64 n = 1;
  for (auto d : shape) n *= d;
  return n;
}

Buffer::Buffer(i64 n) : n_(n) {
  if (n < 0) throw std::invalid_argument("buffer size must be >= 0, received " + std::to_string(n));
  const std::size_t bytes = ((static_cast<std::size_t>(n) * sizeof(float) + 63) / 64) * 64;
  float* p = static_cast<float*>(std::aligned_alloc(64, bytes > 0 ? bytes : 64));
  if (p == nullptr) throw std::bad_alloc();
  std::fill(p, p + n, 0.f);
  ptr_.reset(p);
}

memory wrap(const memory::desc& md, const void* data) {
  return memory(md, engine(), const_cast<void*>(data));
}

namespace {

// The bytes of scratchpad `prim` needs (0 when none). Every primitive is created with a
// user-managed scratchpad (compat::user_scratchpad), so execute() supplies it.
std::size_t scratchpad_bytes(const dnnl::primitive& prim) {
  const auto pd = prim.get_primitive_desc();
  const auto md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  return md == nullptr ? 0 : dnnl_memory_desc_get_size(md);
}

}  // namespace

void execute(const dnnl::primitive& prim, const std::unordered_map<int, memory>& args) {
  apply_threads();
  auto& s = stream();
  const std::size_t bytes = scratchpad_bytes(prim);
  if (bytes == 0) {
    prim.execute(s, args);
  } else {
    // this thread's scratchpad, grown to the largest need seen; an execution waits for its
    // primitive before returning, so one buffer per thread is never used twice at once
    thread_local Buffer scratch;
    const i64 floats = static_cast<i64>((bytes + sizeof(float) - 1) / sizeof(float));
    if (scratch.size() < floats) scratch = Buffer(floats);
    std::unordered_map<int, memory> with = args;
    const memory::desc md({static_cast<memory::dim>(bytes)}, memory::data_type::u8,
                          memory::format_tag::a);
    with.emplace(DNNL_ARG_SCRATCHPAD, memory(md, engine(), scratch.data()));
    prim.execute(s, with);
  }
  s.wait();
}

}  // namespace opd::onednn
