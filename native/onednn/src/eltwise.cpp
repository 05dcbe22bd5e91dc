// Unary eltwise and binary primitives.
#include "opdispatch_onednn/eltwise.h"

#include <map>
#include <stdexcept>

#include "opdispatch_onednn/compat.h"

namespace opd::onednn {

namespace {

using dnnl::algorithm;

const std::map<std::string, algorithm>& eltwise_table() {
  static const std::map<std::string, algorithm> t = {
      {"relu", algorithm::eltwise_relu},         {"clip", algorithm::eltwise_clip},
      {"logistic", algorithm::eltwise_logistic}, {"tanh", algorithm::eltwise_tanh},
      {"elu", algorithm::eltwise_elu},           {"exp", algorithm::eltwise_exp},
      {"abs", algorithm::eltwise_abs},           {"sqrt", algorithm::eltwise_sqrt},
      {"soft_relu", algorithm::eltwise_soft_relu}, {"gelu_erf", algorithm::eltwise_gelu_erf},
      {"gelu_tanh", algorithm::eltwise_gelu_tanh}, {"log", algorithm::eltwise_log},
      {"hardswish", algorithm::eltwise_hardswish}, {"linear", algorithm::eltwise_linear},
      {"swish", algorithm::eltwise_swish},
  };
  return t;
}

const std::map<std::string, algorithm>& binary_table() {
  static const std::map<std::string, algorithm> t = {
      {"add", algorithm::binary_add}, {"mul", algorithm::binary_mul},
      {"sub", algorithm::binary_sub}, {"div", algorithm::binary_div},
      {"max", algorithm::binary_max}, {"min", algorithm::binary_min},
  };
  return t;
}

template <class Table>
algorithm lookup(const Table& t, const std::string& kind, const char* what) {
  auto it = t.find(kind);
  if (it != t.end()) return it->second;
  std::string known;
  for (const auto& kv : t) known += (known.empty() ? "" : ", ") + kv.first;
  throw std::invalid_argument(std::string("unknown ") + what + " '" + kind + "'; known: " + known);
}

template <class Table>
std::vector<std::string> names(const Table& t) {
  std::vector<std::string> out;
  for (const auto& kv : t) out.push_back(kv.first);
  return out;
}

}  // namespace

std::vector<std::string> eltwise_kinds() { return names(eltwise_table()); }
std::vector<std::string> binary_kinds() { return names(binary_table()); }

Eltwise::Eltwise(const std::string& kind, float alpha, float beta, const Dims& dims,
                 const std::string& tag) {
  algorithm alg = lookup(eltwise_table(), kind, "eltwise kind");
  if (kind == "clip" && !(alpha <= beta))
    throw std::invalid_argument("clip bounds must satisfy lo <= hi, received lo=" +
                                std::to_string(alpha) + " hi=" + std::to_string(beta));
  if (kind == "soft_relu") alpha = compat::kSoftReluAlpha;
  if (kind == "hardswish") {
    alpha = compat::kHardSwishAlpha;
    beta = compat::kHardSwishBeta;
  }
  md_ = make_md(dims, tag);
  try {
    auto pd = compat::eltwise_pd(alg, md_, alpha, beta);
    prim_ = dnnl::eltwise_forward(pd);
    impl_ = pd.impl_info_str();
  } catch (const dnnl::error& e) {
    throw std::runtime_error(std::string("oneDNN has no eltwise ") + kind + " for " + describe(md_) +
                             " (" + e.what() + ")");
  }
  shape_ = physical_shape(md_, tag);
}

void Eltwise::run(const float* x, float* y) const {
  if (x == nullptr || y == nullptr) throw std::invalid_argument("eltwise: input and output are required");
  execute(prim_, {{DNNL_ARG_SRC, wrap(md_, x)}, {DNNL_ARG_DST, wrap(md_, y)}});
}

Binary::Binary(const std::string& kind, const Dims& dims, const std::string& tag, const Dims& b_dims,
               const std::string& b_tag, const std::string& eltwise) {
  algorithm alg = lookup(binary_table(), kind, "binary kind");
  if (b_dims.size() != dims.size())
    throw std::invalid_argument("binary operands must have one rank, received " + dims_str(dims) +
                                " and " + dims_str(b_dims));
  for (std::size_t i = 0; i < dims.size(); ++i)
    if (b_dims[i] != dims[i] && b_dims[i] != 1)
      throw std::invalid_argument("binary operand " + dims_str(b_dims) + " does not broadcast to " +
                                  dims_str(dims));
  a_md_ = make_md(dims, tag);
  b_md_ = make_md(b_dims, b_tag);
  dnnl::primitive_attr attr;
  if (eltwise == "relu") {
    dnnl::post_ops po;
    compat::append_eltwise(po, algorithm::eltwise_relu, 0.f, 0.f);
    attr.set_post_ops(po);
  } else if (!eltwise.empty()) {
    throw std::invalid_argument("binary post-op must be '' or 'relu', received '" + eltwise + "'");
  }
  try {
    auto pd = compat::binary_pd(alg, a_md_, b_md_, a_md_, attr);
    prim_ = dnnl::binary(pd);
    impl_ = pd.impl_info_str();
  } catch (const dnnl::error& e) {
    throw std::runtime_error(std::string("oneDNN has no binary ") + kind + " for " +
                             describe(a_md_) + " and " + describe(b_md_) + " (" + e.what() + ")");
  }
  shape_ = physical_shape(a_md_, tag);
  b_shape_ = physical_shape(b_md_, b_tag);
}

void Binary::run(const float* a, const float* b, float* y) const {
  if (a == nullptr || b == nullptr || y == nullptr)
    throw std::invalid_argument("binary: inputs and output are required");
  execute(prim_, {{DNNL_ARG_SRC_0, wrap(a_md_, a)}, {DNNL_ARG_SRC_1, wrap(b_md_, b)},
                  {DNNL_ARG_DST, wrap(a_md_, y)}});
}

}  // namespace opd::onednn
