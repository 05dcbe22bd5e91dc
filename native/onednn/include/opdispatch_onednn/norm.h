// Batch normalization on oneDNN (f32, inference: the given mean and variance).
#pragma once

#include <string>

#include "opdispatch_onednn/common.h"

namespace opd::onednn {

// y = [relu](scale * (x - mean) / sqrt(var + epsilon) + shift) over (N, C, ...) in `tag`.
class BatchNorm {
 public:
  BatchNorm(const Dims& dims, const std::string& tag, float epsilon, bool relu);
  // Copies the four per-channel parameters (C floats each), once.
  void set_params(const float* scale, const float* shift, const float* mean, const float* var);
  void run(const float* x, float* y) const;
  i64 channels() const { return channels_; }
  const Dims& shape() const { return shape_; }
  const std::string& impl() const { return impl_; }

 private:
  memory::desc md_, param_md_;
  dnnl::batch_normalization_forward prim_;
  Buffer scale_, shift_, mean_, var_;
  i64 channels_ = 0;
  Dims shape_;
  std::string impl_;
};

}  // namespace opd::onednn
