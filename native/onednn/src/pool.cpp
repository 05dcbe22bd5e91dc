// 2-D pooling on oneDNN (pooling_v2 in 2.x for dilations; pooling in 3.x).
#include "opdispatch_onednn/pool.h"

#include <stdexcept>

#include "opdispatch_onednn/compat.h"

namespace opd::onednn {

void validate(const PoolSpec& s) {
  const std::pair<const char*, i64> positive[] = {
      {"N", s.n}, {"C", s.c}, {"H", s.h}, {"W", s.w}, {"KH", s.kh}, {"KW", s.kw},
      {"SH", s.sh}, {"SW", s.sw}, {"DH", s.dh}, {"DW", s.dw}};
  for (const auto& [name, v] : positive)
    if (v < 1) throw std::invalid_argument(std::string("pool ") + name + "=" + std::to_string(v) + ": must be >= 1");
  for (i64 p : {s.pt, s.pl, s.pb, s.pr})
    if (p < 0) throw std::invalid_argument("pool pads must be >= 0, received " + std::to_string(p));
  if (s.kind != "max" && s.kind != "avg_include" && s.kind != "avg_exclude")
    throw std::invalid_argument("pool kind must be 'max', 'avg_include' or 'avg_exclude', received '" +
                                s.kind + "'");
  if (s.oh() < 1 || s.ow() < 1)
    throw std::invalid_argument("pool output would be empty: " + std::to_string(s.oh()) + "x" +
                                std::to_string(s.ow()));
}

Pool::Pool(const PoolSpec& s, const std::string& tag) {
  validate(s);
  const dnnl::algorithm alg = s.kind == "max" ? dnnl::algorithm::pooling_max
                              : s.kind == "avg_include" ? dnnl::algorithm::pooling_avg_include_padding
                                                        : dnnl::algorithm::pooling_avg_exclude_padding;
  src_md_ = make_md({s.n, s.c, s.h, s.w}, tag);
  dst_md_ = make_md({s.n, s.c, s.oh(), s.ow()}, tag);
  try {
    auto pd = compat::pool_pd(alg, src_md_, dst_md_, {s.sh, s.sw}, {s.kh, s.kw},
                              {s.dh - 1, s.dw - 1}, {s.pt, s.pl}, {s.pb, s.pr});
    prim_ = compat::pooling_forward(pd);
    impl_ = pd.impl_info_str();
  } catch (const dnnl::error& e) {
    throw std::runtime_error(std::string("oneDNN has no pooling for this case (") + e.what() +
                             "): src " + describe(src_md_));
  }
  src_shape_ = physical_shape(src_md_, tag);
  dst_shape_ = physical_shape(dst_md_, tag);
}

void Pool::run(const float* x, float* y) const {
  if (x == nullptr || y == nullptr) throw std::invalid_argument("pool: input and output are required");
  execute(prim_, {{DNNL_ARG_SRC, wrap(src_md_, x)}, {DNNL_ARG_DST, wrap(dst_md_, y)}});
}

}  // namespace opd::onednn
