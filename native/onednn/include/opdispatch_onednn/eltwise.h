// Elementwise ops on oneDNN (f32): unary eltwise and binary (Add, Mul, ...) primitives.
#pragma once

#include <string>

#include "opdispatch_onednn/common.h"

namespace opd::onednn {

// Names of the unary algorithms: "relu" (alpha: negative slope), "clip" (alpha, beta: bounds),
// "logistic", "tanh", "elu" (alpha), "exp", "abs", "sqrt", "soft_relu", "gelu_erf",
// "gelu_tanh", "log", "hardswish", "linear" (alpha * x + beta), "swish" (alpha).
std::vector<std::string> eltwise_kinds();

// y = f(x) over a tensor of `dims` in format `tag` (a plain "a" over the element count for
// any standard tensor); padding of blocked formats stays zero.
class Eltwise {
 public:
  Eltwise(const std::string& kind, float alpha, float beta, const Dims& dims, const std::string& tag);
  void run(const float* x, float* y) const;
  const Dims& shape() const { return shape_; }
  const std::string& impl() const { return impl_; }

 private:
  memory::desc md_;
  dnnl::eltwise_forward prim_;
  Dims shape_;
  std::string impl_;
};

// Binary algorithms: "add", "mul", "sub", "div", "max", "min".
std::vector<std::string> binary_kinds();

// y = post(a op b): a and y of `dims` in `tag`; b of `b_dims` in `b_tag` (equal dims, or of
// one rank with 1s where it broadcasts); `eltwise` "" or "relu" as a post-op.
class Binary {
 public:
  Binary(const std::string& kind, const Dims& dims, const std::string& tag, const Dims& b_dims,
         const std::string& b_tag, const std::string& eltwise);
  void run(const float* a, const float* b, float* y) const;
  const Dims& shape() const { return shape_; }
  const Dims& b_shape() const { return b_shape_; }
  const std::string& impl() const { return impl_; }

 private:
  memory::desc a_md_, b_md_;
  dnnl::binary prim_;
  Dims shape_, b_shape_;
  std::string impl_;
};

}  // namespace opd::onednn
