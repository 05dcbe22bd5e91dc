// Matrix products on oneDNN's matmul primitive, weights in the format oneDNN picks.
#include "opdispatch_onednn/matmul.h"

#include <cstring>
#include <stdexcept>

#include "opdispatch_onednn/compat.h"

namespace opd::onednn {

namespace {

const char* plain(std::size_t rank) {
  static const char* tags[] = {"", "a", "ab", "abc", "abcd", "abcde"};
  if (rank < 1 || rank > 5) throw std::invalid_argument("rank must be 1..5, received " + std::to_string(rank));
  return tags[rank];
}

memory::desc any_md(const Dims& d) {
  return memory::desc(memory::dims(d.begin(), d.end()), memory::data_type::f32,
                      memory::format_tag::any);
}

memory::desc bias_md(const MatMulSpec& s) {
  Dims d(s.weights.size(), 1);
  d.back() = s.weights.back();
  return make_md(d, plain(d.size()));
}

dnnl::matmul::primitive_desc make_pd(const MatMulSpec& s, const memory::desc& src,
                                     const memory::desc& wei) {
  validate(s);
  const Dims dst = matmul_dst_dims(s);
  memory::desc bias;
  if (s.bias) bias = bias_md(s);
  try {
    return compat::matmul_pd(src, wei, bias, make_md(dst, plain(dst.size())), post_attributes(s.post));
  } catch (const dnnl::error& e) {
    throw std::runtime_error(std::string("oneDNN has no matmul for this case (") + e.what() +
                             "): src " + describe(src) + ", weights " + describe(wei));
  }
}

}  // namespace

void validate(const MatMulSpec& s) {
  const std::size_t r = s.src.size();
  if (r < 2 || r > 5 || s.weights.size() != r)
    throw std::invalid_argument("matmul src and weights must have one rank in 2..5, received " +
                                dims_str(s.src) + " and " + dims_str(s.weights));
  for (auto d : s.src)
    if (d < 1) throw std::invalid_argument("matmul src dims must be >= 1, received " + dims_str(s.src));
  for (auto d : s.weights)
    if (d < 1)
      throw std::invalid_argument("matmul weights dims must be >= 1, received " + dims_str(s.weights));
  if (s.src[r - 1] != s.weights[r - 2])
    throw std::invalid_argument("matmul inner dims differ: src " + dims_str(s.src) + ", weights " +
                                dims_str(s.weights));
  for (std::size_t i = 0; i + 2 < r; ++i)
    if (s.src[i] != s.weights[i] && s.src[i] != 1 && s.weights[i] != 1)
      throw std::invalid_argument("matmul batch dims do not broadcast: src " + dims_str(s.src) +
                                  ", weights " + dims_str(s.weights));
}

Dims matmul_dst_dims(const MatMulSpec& s) {
  const std::size_t r = s.src.size();
  Dims d(r);
  for (std::size_t i = 0; i + 2 < r; ++i) d[i] = std::max(s.src[i], s.weights[i]);
  d[r - 2] = s.src[r - 2];
  d[r - 1] = s.weights[r - 1];
  return d;
}

MatMulFormats matmul_formats(const MatMulSpec& s, const std::string& src_tag) {
  auto pd = make_pd(s, make_md(s.src, src_tag), any_md(s.weights));
  return {tag_of(pd.weights_desc()), describe(pd.weights_desc()), pd.impl_info_str()};
}

MatMul::MatMul(const MatMulSpec& s, const std::string& src_tag, const std::string& weights_tag)
    : spec_(s) {
  given_wei_md_ = make_md(s.weights, weights_tag);
  auto pd = make_pd(s, make_md(s.src, src_tag), any_md(s.weights));
  src_md_ = pd.src_desc();
  wei_md_ = pd.weights_desc();
  dst_md_ = pd.dst_desc();
  if (s.bias) bias_md_ = bias_md(s);
  prim_ = dnnl::matmul(pd);
  impl_ = pd.impl_info_str();
  in_place_ = (wei_md_ == given_wei_md_);
  if (!in_place_)
    wei_reorder_ = dnnl::reorder(compat::reorder_pd(given_wei_md_, wei_md_));
  src_shape_ = physical_shape(src_md_, src_tag);
  wei_shape_ = physical_shape(given_wei_md_, weights_tag);
  dst_shape_ = physical_shape(dst_md_, plain(s.src.size()));
}

std::string MatMul::weights_format() const {
  const std::string t = tag_of(wei_md_);
  return t.empty() ? describe(wei_md_) : t;
}

void MatMul::set_weights(const float* w, const std::string& tag) {
  if (w == nullptr) throw std::invalid_argument("matmul set_weights: weights are required");
  const memory::desc from = make_md(spec_.weights, tag);
  Buffer packed(static_cast<i64>(wei_md_.get_size() / sizeof(float)));
  dnnl::reorder r(compat::reorder_pd(from, wei_md_));
  execute(r, {{DNNL_ARG_FROM, wrap(from, w)}, {DNNL_ARG_TO, wrap(wei_md_, packed.data())}});
  packed_ = std::move(packed);
}

void MatMul::run(const float* a, const float* w, const float* b, const float* residual,
                 float* y) const {
  if (a == nullptr || y == nullptr) throw std::invalid_argument("matmul: input and output are required");
  if (spec_.bias && b == nullptr) throw std::invalid_argument("matmul: the bias is required");
  if (spec_.post.sum && residual == nullptr)
    throw std::invalid_argument("matmul: the residual (sum post-op) is required");
  const float* wp = nullptr;
  Buffer scratch;
  if (!packed_.empty()) {
    wp = packed_.data();
  } else if (w == nullptr) {
    throw std::invalid_argument("matmul: weights are required (none were set at build)");
  } else if (in_place_) {
    wp = w;
  } else {
    scratch = Buffer(static_cast<i64>(wei_md_.get_size() / sizeof(float)));
    execute(wei_reorder_, {{DNNL_ARG_FROM, wrap(given_wei_md_, w)},
                           {DNNL_ARG_TO, wrap(wei_md_, scratch.data())}});
    wp = scratch.data();
  }
  if (spec_.post.sum) std::memcpy(y, residual, dst_md_.get_size());
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, wrap(src_md_, a)},
                                       {DNNL_ARG_WEIGHTS, wrap(wei_md_, wp)},
                                       {DNNL_ARG_DST, wrap(dst_md_, y)}};
  if (spec_.bias) args.emplace(DNNL_ARG_BIAS, wrap(bias_md_, b));
  execute(prim_, args);
}

}  // namespace opd::onednn
