// 2-D convolution on oneDNN's convolution_forward (f32, inference), with post-ops.
#pragma once

#include <string>

#include "opdispatch_onednn/common.h"

namespace opd::onednn {

// The fused epilogue: dst = eltwise(conv + bias [+ residual]) where `sum` adds the residual
// (oneDNN's sum post-op) and `eltwise` is "", "relu" or "clip" (alpha = lo, beta = hi).
struct PostOps {
  bool sum = false;
  std::string eltwise;
  float alpha = 0.f;
  float beta = 0.f;
  // When set (a concrete dst descriptor), the residual is added by a binary-add post-op that
  // reads it in place, instead of the sum post-op (which needs it copied into dst first).
  memory::desc residual_md;
};

// The primitive attributes of a post-op chain (sum first, then the eltwise); throws
// std::invalid_argument for an unknown eltwise or clip bounds with lo > hi.
dnnl::primitive_attr post_attributes(const PostOps& p);

struct ConvSpec {
  i64 n = 0, c = 0, h = 0, w = 0;   // input
  i64 m = 0, kh = 0, kw = 0;        // output channels, kernel
  i64 sh = 1, sw = 1, dh = 1, dw = 1;  // strides, dilations (ONNX: 1 = dense)
  i64 pt = 0, pl = 0, pb = 0, pr = 0;  // explicit pads
  i64 group = 1;
  bool bias = false;
  PostOps post;

  i64 oh() const { return (h + pt + pb - (kh - 1) * dh - 1) / sh + 1; }
  i64 ow() const { return (w + pl + pr - (kw - 1) * dw - 1) / sw + 1; }
};

// Throws std::invalid_argument naming the first inconsistent field.
void validate(const ConvSpec& s);

// Logical dims of the weights as oneDNN sees them: (M, C, KH, KW) for group 1, else
// (group, M/group, C/group, KH, KW) (the same memory as ONNX's (M, C/group, KH, KW) in plain
// order).
Dims conv_weight_dims(const ConvSpec& s);

// What oneDNN picks for a convolution given src / dst formats (a tag or "any"; weights are
// always "any"): each chosen format's tag ("" when it is none of the known tags), a
// description of each, and the implementation's name.
struct ConvFormats {
  std::string src, weights, dst;
  std::string src_desc, weights_desc, dst_desc;
  std::string impl;
};
ConvFormats conv_formats(const ConvSpec& s, const std::string& src_tag, const std::string& dst_tag);

// A convolution primitive created once: src and dst in the given formats (known tags, not
// "any"), the weights in the format oneDNN picks. Weights arrive in `weights_tag` (a tag over
// conv_weight_dims): when it is the primitive's format they are used in place, else they are
// reordered, once by set_weights() for constants or on every run.
class Conv {
 public:
  Conv(const ConvSpec& s, const std::string& src_tag, const std::string& dst_tag,
       const std::string& weights_tag);

  // Reorders constant weights, given in format `tag` (over conv_weight_dims), into the
  // primitive's format, once; run() then ignores its `w`.
  void set_weights(const float* w, const std::string& tag);
  bool has_weights() const { return !packed_.empty(); }
  bool weights_in_place() const { return in_place_; }
  // Whether the residual is read in place by a binary-add post-op (else: sum post-op on a copy).
  bool residual_in_place() const { return !spec_.post.residual_md.is_zero(); }

  // y = post(conv(x, w) + b [+ residual]); `w` may be null after set_weights(); `b` is
  // required iff spec.bias; `residual` (dst format) iff spec.post.sum.
  void run(const float* x, const float* w, const float* b, const float* residual, float* y) const;

  const ConvSpec& spec() const { return spec_; }
  const Dims& src_shape() const { return src_shape_; }
  const Dims& weights_shape() const { return wei_shape_; }
  const Dims& dst_shape() const { return dst_shape_; }
  const std::string& impl() const { return impl_; }
  std::string weights_format() const;

 private:
  ConvSpec spec_;
  memory::desc src_md_, wei_md_, given_wei_md_, bias_md_, dst_md_;
  dnnl::convolution_forward prim_;
  dnnl::reorder wei_reorder_;
  bool in_place_ = false;
  Buffer packed_;
  Dims src_shape_, wei_shape_, dst_shape_;
  std::string impl_;
};

}  // namespace opd::onednn
