// Reorder primitives between named formats, cached per (dims, source tag, destination tag).
#include "opdispatch_onednn/layouts.h"

#include <map>
#include <mutex>
#include <tuple>

#include "opdispatch_onednn/compat.h"

namespace opd::onednn {

Dims tag_physical_shape(const Dims& dims, const std::string& tag) {
  return physical_shape(make_md(dims, tag), tag);
}

namespace {

struct Cached {
  memory::desc src, dst;
  dnnl::reorder prim;
};

// A small cache: a plan's converters see a few shapes each; cleared when it grows large.
// Entries are returned by value (oneDNN objects are reference-counted handles), so a clear
// by one thread never pulls a primitive from under another.
constexpr std::size_t kMaxCached = 512;

Cached cached_reorder(const Dims& dims, const std::string& src_tag,
                             const std::string& dst_tag) {
  static std::mutex mu;
  static std::map<std::tuple<Dims, std::string, std::string>, Cached> cache;
  auto key = std::make_tuple(dims, src_tag, dst_tag);
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  if (cache.size() >= kMaxCached) cache.clear();
  Cached c;
  c.src = make_md(dims, src_tag);
  c.dst = make_md(dims, dst_tag);
  c.prim = dnnl::reorder(compat::reorder_pd(c.src, c.dst));
  return cache.emplace(key, std::move(c)).first->second;
}

}  // namespace

void reorder(const Dims& dims, const std::string& src_tag, const std::string& dst_tag,
             const float* src, float* dst) {
  const Cached c = cached_reorder(dims, src_tag, dst_tag);
  memory s = wrap(c.src, src), d = wrap(c.dst, dst);
  execute(c.prim, {{DNNL_ARG_FROM, s}, {DNNL_ARG_TO, d}});
}

}  // namespace opd::onednn
