// Convolutions on oneDNN: primitive descriptors with `format_tag::any` (oneDNN picks blocked
// formats), post-ops for the fused Relu / Clip / residual sum, weights packed once.
#include "opdispatch_onednn/conv.h"

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "opdispatch_onednn/compat.h"

namespace opd::onednn {

namespace {

std::string field(const char* name, i64 v) { return std::string(name) + "=" + std::to_string(v); }

memory::desc md_or_any(const Dims& dims, const std::string& tag) {
  if (tag == "any")
    return memory::desc(memory::dims(dims.begin(), dims.end()), memory::data_type::f32,
                        memory::format_tag::any);
  return make_md(dims, tag);
}

}  // namespace

// The attributes of a post-op chain (shared with matmul.cpp).
dnnl::primitive_attr post_attributes(const PostOps& p) {
  dnnl::primitive_attr attr;
  dnnl::post_ops po;
  if (p.sum && !p.residual_md.is_zero())
    po.append_binary(dnnl::algorithm::binary_add, p.residual_md);
  else if (p.sum)
    po.append_sum(1.0f);
  if (p.eltwise == "relu") {
    compat::append_eltwise(po, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
  } else if (p.eltwise == "clip") {
    if (std::isnan(p.alpha) || std::isnan(p.beta) || p.alpha > p.beta)
      throw std::invalid_argument("clip bounds must satisfy lo <= hi, received lo=" +
                                  std::to_string(p.alpha) + " hi=" + std::to_string(p.beta));
    compat::append_eltwise(po, dnnl::algorithm::eltwise_clip, p.alpha, p.beta);
  } else if (!p.eltwise.empty()) {
    throw std::invalid_argument("conv post-op eltwise must be '', 'relu' or 'clip', received '" +
                                p.eltwise + "'");
  }
  attr.set_post_ops(po);
  return attr;
}

namespace {

dnnl::convolution_forward::primitive_desc make_pd(const ConvSpec& s, const memory::desc& src,
                                                  const memory::desc& wei,
                                                  const memory::desc& dst) {
  validate(s);
  memory::desc bias;
  if (s.bias) bias = make_md({s.m}, "a");
  try {
    return compat::conv_pd(src, wei, bias, dst, {s.sh, s.sw}, {s.dh - 1, s.dw - 1},
                           {s.pt, s.pl}, {s.pb, s.pr}, post_attributes(s.post));
  } catch (const dnnl::error& e) {
    throw std::runtime_error(std::string("oneDNN has no convolution for this case (") + e.what() +
                             "): src " + describe(src) + ", dst " + describe(dst));
  }
}

}  // namespace

void validate(const ConvSpec& s) {
  const std::pair<const char*, i64> positive[] = {
      {"N", s.n}, {"C", s.c}, {"H", s.h}, {"W", s.w}, {"M", s.m}, {"KH", s.kh}, {"KW", s.kw},
      {"SH", s.sh}, {"SW", s.sw}, {"DH", s.dh}, {"DW", s.dw}, {"group", s.group}};
  for (const auto& [name, v] : positive)
    if (v < 1) throw std::invalid_argument("conv " + field(name, v) + ": must be >= 1");
  const std::pair<const char*, i64> pads[] = {{"PT", s.pt}, {"PL", s.pl}, {"PB", s.pb}, {"PR", s.pr}};
  for (const auto& [name, v] : pads)
    if (v < 0) throw std::invalid_argument("conv pad " + field(name, v) + ": must be >= 0");
  if (s.c % s.group || s.m % s.group)
    throw std::invalid_argument("conv group=" + std::to_string(s.group) + " must divide C=" +
                                std::to_string(s.c) + " and M=" + std::to_string(s.m));
  if (s.oh() < 1 || s.ow() < 1)
    throw std::invalid_argument("conv output would be empty: " + std::to_string(s.oh()) + "x" +
                                std::to_string(s.ow()) + " from input " + std::to_string(s.h) +
                                "x" + std::to_string(s.w));
}

Dims conv_weight_dims(const ConvSpec& s) {
  if (s.group == 1) return {s.m, s.c, s.kh, s.kw};
  return {s.group, s.m / s.group, s.c / s.group, s.kh, s.kw};
}

ConvFormats conv_formats(const ConvSpec& s, const std::string& src_tag,
                         const std::string& dst_tag) {
  validate(s);
  const Dims wdims = conv_weight_dims(s);
  auto pd = make_pd(s, md_or_any({s.n, s.c, s.h, s.w}, src_tag), md_or_any(wdims, "any"),
                    md_or_any({s.n, s.m, s.oh(), s.ow()}, dst_tag));
  ConvFormats f;
  f.src = tag_of(pd.src_desc());
  f.weights = tag_of(pd.weights_desc());
  f.dst = tag_of(pd.dst_desc());
  f.src_desc = describe(pd.src_desc());
  f.weights_desc = describe(pd.weights_desc());
  f.dst_desc = describe(pd.dst_desc());
  f.impl = pd.impl_info_str();
  return f;
}

Conv::Conv(const ConvSpec& s, const std::string& src_tag, const std::string& dst_tag,
           const std::string& weights_tag)
    : spec_(s) {
  validate(s);
  const Dims wdims = conv_weight_dims(s);
  given_wei_md_ = make_md(wdims, weights_tag);
  const memory::desc src = make_md({s.n, s.c, s.h, s.w}, src_tag);
  const memory::desc dst = make_md({s.n, s.m, s.oh(), s.ow()}, dst_tag);
  auto pd = make_pd(s, src, md_or_any(wdims, "any"), dst);
  if (s.post.sum) {
    // prefer reading the residual in place (binary-add post-op) when oneDNN has an optimised
    // kernel for it; else keep the sum post-op on a copy of the residual
    ConvSpec b = s;
    b.post.residual_md = dst;
    try {
      auto pb = make_pd(b, src, md_or_any(wdims, "any"), dst);
      const std::string impl = pb.impl_info_str();
      if (impl.rfind("ref", 0) != 0 && pb.weights_desc() == pd.weights_desc()) {
        pd = pb;
        spec_ = b;
      }
    } catch (const std::exception&) {
    }
  }
  src_md_ = pd.src_desc();
  wei_md_ = pd.weights_desc();
  dst_md_ = pd.dst_desc();
  if (s.bias) bias_md_ = pd.bias_desc();
  prim_ = dnnl::convolution_forward(pd);
  impl_ = pd.impl_info_str();
  in_place_ = (wei_md_ == given_wei_md_);
  if (!in_place_)
    wei_reorder_ = dnnl::reorder(compat::reorder_pd(given_wei_md_, wei_md_));
  src_shape_ = physical_shape(src_md_, src_tag);
  wei_shape_ = physical_shape(given_wei_md_, weights_tag);
  dst_shape_ = physical_shape(dst_md_, dst_tag);
}

std::string Conv::weights_format() const {
  const std::string t = tag_of(wei_md_);
  return t.empty() ? describe(wei_md_) : t;
}

void Conv::set_weights(const float* w, const std::string& tag) {
  if (w == nullptr) throw std::invalid_argument("conv set_weights: weights are required");
  const memory::desc from = make_md(conv_weight_dims(spec_), tag);
  Buffer packed(static_cast<i64>(wei_md_.get_size() / sizeof(float)));
  memory src = wrap(from, w), dst = wrap(wei_md_, packed.data());
  dnnl::reorder r(compat::reorder_pd(from, wei_md_));
  execute(r, {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}});
  packed_ = std::move(packed);
}

void Conv::run(const float* x, const float* w, const float* b, const float* residual,
               float* y) const {
  if (x == nullptr || y == nullptr) throw std::invalid_argument("conv: input and output are required");
  if (spec_.bias && b == nullptr) throw std::invalid_argument("conv: the bias is required");
  if (spec_.post.sum && residual == nullptr)
    throw std::invalid_argument("conv: the residual (sum post-op) is required");
  const float* wp = nullptr;
  Buffer scratch;
  if (!packed_.empty()) {
    wp = packed_.data();
  } else if (w == nullptr) {
    throw std::invalid_argument("conv: weights are required (none were set at build)");
  } else if (in_place_) {
    wp = w;
  } else {
    scratch = Buffer(static_cast<i64>(wei_md_.get_size() / sizeof(float)));
    memory src = wrap(given_wei_md_, w), dst = wrap(wei_md_, scratch.data());
    execute(wei_reorder_, {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}});
    wp = scratch.data();
  }
  if (spec_.post.sum && !residual_in_place()) std::memcpy(y, residual, dst_md_.get_size());
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, wrap(src_md_, x)},
      {DNNL_ARG_WEIGHTS, wrap(wei_md_, wp)},
      {DNNL_ARG_DST, wrap(dst_md_, y)}};
  if (residual_in_place())
    args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1,
                 wrap(spec_.post.residual_md, residual));
  if (spec_.bias) args.emplace(DNNL_ARG_BIAS, wrap(bias_md_, b));
  execute(prim_, args);
}

}  // namespace opd::onednn
