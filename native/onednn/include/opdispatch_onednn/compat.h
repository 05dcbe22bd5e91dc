// The few places where oneDNN 2.x and 3.x differ in API, behind one set of functions (the
// rest of the backend is written once). 2.x builds an operation descriptor, then a primitive
// descriptor; 3.x builds the primitive descriptor directly, with the engine first. Memory
// descriptors are plain C structs in 2.x and opaque (with getters) in 3.x.
#pragma once

#include "oneapi/dnnl/dnnl.hpp"
#include "opdispatch_onednn/common.h"

#ifndef DNNL_VERSION_MAJOR
#error "oneDNN's dnnl_version.h did not define DNNL_VERSION_MAJOR"
#endif

namespace opd::onednn::compat {

using dnnl::algorithm;
using dnnl::prop_kind;

// -- memory descriptor accessors --------------------------------------------------------------

inline int ndims(const memory::desc& md) {
#if DNNL_VERSION_MAJOR >= 3
  return md.get_ndims();
#else
  return md.data.ndims;
#endif
}

inline Dims dims(const memory::desc& md) {
#if DNNL_VERSION_MAJOR >= 3
  auto d = md.get_dims();
  return Dims(d.begin(), d.end());
#else
  return Dims(md.data.dims, md.data.dims + md.data.ndims);
#endif
}

inline Dims padded_dims(const memory::desc& md) {
#if DNNL_VERSION_MAJOR >= 3
  auto d = md.get_padded_dims();
  return Dims(d.begin(), d.end());
#else
  return Dims(md.data.padded_dims, md.data.padded_dims + md.data.ndims);
#endif
}

inline bool is_blocked(const memory::desc& md) {
#if DNNL_VERSION_MAJOR >= 3
  return md.get_format_kind() == memory::format_kind::blocked;
#else
  return md.data.format_kind == dnnl_blocked;
#endif
}

// Strides of the outer dims, and the inner blocks (size, dim index), outermost block first.
inline void blocking(const memory::desc& md, Dims& strides, Dims& inner_blks, Dims& inner_idxs) {
#if DNNL_VERSION_MAJOR >= 3
  auto s = md.get_strides();
  auto b = md.get_inner_blks();
  auto i = md.get_inner_idxs();
  strides.assign(s.begin(), s.end());
  inner_blks.assign(b.begin(), b.end());
  inner_idxs.assign(i.begin(), i.end());
#else
  const auto& bd = md.data.format_desc.blocking;
  strides.assign(bd.strides, bd.strides + md.data.ndims);
  inner_blks.assign(bd.inner_blks, bd.inner_blks + bd.inner_nblks);
  inner_idxs.assign(bd.inner_idxs, bd.inner_idxs + bd.inner_nblks);
#endif
}

// -- post-ops ---------------------------------------------------------------------------------

inline void append_eltwise(dnnl::post_ops& po, algorithm alg, float alpha, float beta) {
#if DNNL_VERSION_MAJOR >= 3
  po.append_eltwise(alg, alpha, beta);
#else
  po.append_eltwise(1.0f, alg, alpha, beta);
#endif
}

// -- primitive descriptors --------------------------------------------------------------------
//
// Every primitive is created with a user-managed scratchpad (execute() hands each execution
// the calling thread's own buffer). The default, library-managed scratchpad of a oneDNN
// built without DNNL_ENABLE_CONCURRENT_EXEC (Debian's) is a thread-local buffer sized when a
// primitive is created, so a primitive executed on another thread than the one that created
// it (a Session shared by a server's threads) reads and writes memory it does not own.

inline dnnl::primitive_attr user_scratchpad(dnnl::primitive_attr attr = dnnl::primitive_attr()) {
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

inline dnnl::reorder::primitive_desc reorder_pd(const memory::desc& src, const memory::desc& dst) {
  return dnnl::reorder::primitive_desc(engine(), src, engine(), dst, user_scratchpad());
}

inline dnnl::convolution_forward::primitive_desc conv_pd(
    const memory::desc& src, const memory::desc& wei, const memory::desc& bias,
    const memory::desc& dst, const memory::dims& strides, const memory::dims& dilates,
    const memory::dims& pad_l, const memory::dims& pad_r, const dnnl::primitive_attr& attr) {
#if DNNL_VERSION_MAJOR >= 3
  return dnnl::convolution_forward::primitive_desc(
      engine(), prop_kind::forward_inference, algorithm::convolution_direct, src, wei, bias, dst,
      strides, dilates, pad_l, pad_r, user_scratchpad(attr));
#else
  dnnl::convolution_forward::desc d(prop_kind::forward_inference, algorithm::convolution_direct,
                                    src, wei, bias, dst, strides, dilates, pad_l, pad_r);
  return dnnl::convolution_forward::primitive_desc(d, user_scratchpad(attr), engine());
#endif
}

inline dnnl::matmul::primitive_desc matmul_pd(const memory::desc& src, const memory::desc& wei,
                                              const memory::desc& bias, const memory::desc& dst,
                                              const dnnl::primitive_attr& attr) {
#if DNNL_VERSION_MAJOR >= 3
  return dnnl::matmul::primitive_desc(engine(), src, wei, bias, dst, user_scratchpad(attr));
#else
  dnnl::matmul::desc d(src, wei, bias, dst);
  return dnnl::matmul::primitive_desc(d, user_scratchpad(attr), engine());
#endif
}

#if DNNL_VERSION_MAJOR >= 3
using pooling_forward = dnnl::pooling_forward;
#else
using pooling_forward = dnnl::pooling_v2_forward;  // 2.x: the pooling with dilations
#endif

inline pooling_forward::primitive_desc pool_pd(algorithm alg, const memory::desc& src,
                                               const memory::desc& dst,
                                               const memory::dims& strides,
                                               const memory::dims& kernel,
                                               const memory::dims& dilation,
                                               const memory::dims& pad_l,
                                               const memory::dims& pad_r) {
#if DNNL_VERSION_MAJOR >= 3
  return pooling_forward::primitive_desc(engine(), prop_kind::forward_inference, alg, src, dst,
                                         strides, kernel, dilation, pad_l, pad_r,
                                         user_scratchpad());
#else
  pooling_forward::desc d(prop_kind::forward_inference, alg, src, dst, strides, kernel, dilation,
                          pad_l, pad_r);
  return pooling_forward::primitive_desc(d, user_scratchpad(), engine());
#endif
}

inline dnnl::eltwise_forward::primitive_desc eltwise_pd(algorithm alg, const memory::desc& md,
                                                        float alpha, float beta) {
#if DNNL_VERSION_MAJOR >= 3
  return dnnl::eltwise_forward::primitive_desc(engine(), prop_kind::forward_inference, alg, md, md,
                                               alpha, beta, user_scratchpad());
#else
  dnnl::eltwise_forward::desc d(prop_kind::forward_inference, alg, md, alpha, beta);
  return dnnl::eltwise_forward::primitive_desc(d, user_scratchpad(), engine());
#endif
}

inline dnnl::batch_normalization_forward::primitive_desc bnorm_pd(const memory::desc& md,
                                                                  float epsilon,
                                                                  dnnl::normalization_flags flags) {
#if DNNL_VERSION_MAJOR >= 3
  return dnnl::batch_normalization_forward::primitive_desc(
      engine(), prop_kind::forward_inference, md, md, epsilon, flags, user_scratchpad());
#else
  dnnl::batch_normalization_forward::desc d(prop_kind::forward_inference, md, epsilon, flags);
  return dnnl::batch_normalization_forward::primitive_desc(d, user_scratchpad(), engine());
#endif
}

inline dnnl::binary::primitive_desc binary_pd(algorithm alg, const memory::desc& a,
                                              const memory::desc& b, const memory::desc& dst,
                                              const dnnl::primitive_attr& attr) {
#if DNNL_VERSION_MAJOR >= 3
  return dnnl::binary::primitive_desc(engine(), alg, a, b, dst, user_scratchpad(attr));
#else
  dnnl::binary::desc d(alg, a, b, dst);
  return dnnl::binary::primitive_desc(d, user_scratchpad(attr), engine());
#endif
}

// Softplus: 2.x soft_relu is log(1 + exp(x)); 3.x's takes alpha (1 gives the same).
constexpr float kSoftReluAlpha = 1.0f;

// HardSwish: 2.x hardswish is x * relu6(x + 3) / 6 and ignores alpha and beta; 3.x's is
// x * max(0, min(1, alpha * x + beta)) (with alpha = beta = 0, x * 0: the ONNX op needs these).
constexpr float kHardSwishAlpha = 1.0f / 6.0f;
constexpr float kHardSwishBeta = 0.5f;

}  // namespace opd::onednn::compat
