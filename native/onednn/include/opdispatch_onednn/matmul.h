// Matrix products on oneDNN's matmul primitive (f32): Gemm and MatMul, 2-D or batched.
#pragma once

#include <string>

#include "opdispatch_onednn/common.h"
#include "opdispatch_onednn/conv.h"  // PostOps

namespace opd::onednn {

// dst (..., M, N) = post(src (..., M, K) x weights (..., K, N) + bias (N)): src, weights and
// dst of one rank (2 to 5); batch dims of src and weights equal or 1 (broadcast).
struct MatMulSpec {
  Dims src, weights;
  bool bias = false;
  PostOps post;  // eltwise only ("", "relu", "clip"); sum adds a residual of dst's shape
};

void validate(const MatMulSpec& s);
Dims matmul_dst_dims(const MatMulSpec& s);

// The weights format oneDNN picks (tag over the weights dims, "" when unnamed), a description
// and the implementation's name, for src in `src_tag` and weights "any".
struct MatMulFormats {
  std::string weights, weights_desc, impl;
};
MatMulFormats matmul_formats(const MatMulSpec& s, const std::string& src_tag);

// A matmul primitive created once; src in `src_tag`, dst plain, weights arriving in
// `weights_tag` (used in place when it is the primitive's format, else reordered: once by
// set_weights() for constants, or on every run).
class MatMul {
 public:
  MatMul(const MatMulSpec& s, const std::string& src_tag, const std::string& weights_tag);
  void set_weights(const float* w, const std::string& tag);
  bool has_weights() const { return !packed_.empty(); }
  bool weights_in_place() const { return in_place_; }
  void run(const float* a, const float* w, const float* b, const float* residual, float* y) const;

  const MatMulSpec& spec() const { return spec_; }
  const Dims& src_shape() const { return src_shape_; }
  const Dims& weights_shape() const { return wei_shape_; }
  const Dims& dst_shape() const { return dst_shape_; }
  const std::string& impl() const { return impl_; }
  std::string weights_format() const;

 private:
  MatMulSpec spec_;
  memory::desc src_md_, wei_md_, given_wei_md_, bias_md_, dst_md_;
  dnnl::matmul prim_;
  dnnl::reorder wei_reorder_;
  bool in_place_ = false;
  Buffer packed_;
  Dims src_shape_, wei_shape_, dst_shape_;
  std::string impl_;
};

}  // namespace opd::onednn
