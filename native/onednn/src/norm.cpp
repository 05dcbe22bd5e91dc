// Batch normalization (inference) with the global statistics, scale, shift and optional Relu.
#include "opdispatch_onednn/norm.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "opdispatch_onednn/compat.h"

namespace opd::onednn {

BatchNorm::BatchNorm(const Dims& dims, const std::string& tag, float epsilon, bool relu) {
  if (dims.size() < 2)
    throw std::invalid_argument("batch normalization needs (N, C, ...), received " + dims_str(dims));
  if (!(epsilon >= 0.f) || std::isinf(epsilon))
    throw std::invalid_argument("batch normalization epsilon must be finite and >= 0, received " +
                                std::to_string(epsilon));
  md_ = make_md(dims, tag);
  channels_ = dims[1];
  param_md_ = make_md({channels_}, "a");
  auto flags = dnnl::normalization_flags::use_global_stats | dnnl::normalization_flags::use_scale |
               dnnl::normalization_flags::use_shift;
  if (relu) flags = flags | dnnl::normalization_flags::fuse_norm_relu;
  try {
    auto pd = compat::bnorm_pd(md_, epsilon, flags);
    prim_ = dnnl::batch_normalization_forward(pd);
    impl_ = pd.impl_info_str();
  } catch (const dnnl::error& e) {
    throw std::runtime_error(std::string("oneDNN has no batch normalization for ") + describe(md_) +
                             " (" + e.what() + ")");
  }
  shape_ = physical_shape(md_, tag);
}

void BatchNorm::set_params(const float* scale, const float* shift, const float* mean,
                           const float* var) {
  if (!scale || !shift || !mean || !var)
    throw std::invalid_argument("batch normalization needs scale, shift, mean and var");
  auto copy = [&](const float* p) {
    Buffer b(channels_);
    std::copy(p, p + channels_, b.data());
    return b;
  };
  scale_ = copy(scale);
  shift_ = copy(shift);
  mean_ = copy(mean);
  var_ = copy(var);
}

void BatchNorm::run(const float* x, float* y) const {
  if (x == nullptr || y == nullptr) throw std::invalid_argument("batch normalization: input and output are required");
  if (scale_.empty()) throw std::invalid_argument("batch normalization: parameters were not set");
  execute(prim_, {{DNNL_ARG_SRC, wrap(md_, x)}, {DNNL_ARG_DST, wrap(md_, y)},
                  {DNNL_ARG_SCALE, wrap(param_md_, scale_.data())},
                  {DNNL_ARG_SHIFT, wrap(param_md_, shift_.data())},
                  {DNNL_ARG_MEAN, wrap(param_md_, mean_.data())},
                  {DNNL_ARG_VARIANCE, wrap(param_md_, var_.data())}});
}

}  // namespace opd::onednn
