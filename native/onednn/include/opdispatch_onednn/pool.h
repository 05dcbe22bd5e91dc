// 2-D pooling on oneDNN (f32, inference): max, average with or without the padding counted.
#pragma once

#include <string>

#include "opdispatch_onednn/common.h"

namespace opd::onednn {

struct PoolSpec {
  i64 n = 0, c = 0, h = 0, w = 0;
  i64 kh = 1, kw = 1, sh = 1, sw = 1, dh = 1, dw = 1;  // ONNX dilations (1 = dense)
  i64 pt = 0, pl = 0, pb = 0, pr = 0;  // explicit pads (ceil mode: the end pads grown)
  std::string kind;  // "max", "avg_include", "avg_exclude"

  i64 oh() const { return (h + pt + pb - (kh - 1) * dh - 1) / sh + 1; }
  i64 ow() const { return (w + pl + pr - (kw - 1) * dw - 1) / sw + 1; }
};

void validate(const PoolSpec& s);

// src and dst in format `tag` (a rank-4 activation tag).
class Pool {
 public:
  Pool(const PoolSpec& s, const std::string& tag);
  void run(const float* x, float* y) const;
  const Dims& src_shape() const { return src_shape_; }
  const Dims& dst_shape() const { return dst_shape_; }
  const std::string& impl() const { return impl_; }

 private:
  memory::desc src_md_, dst_md_;
  dnnl::primitive prim_;
  Dims src_shape_, dst_shape_;
  std::string impl_;
};

}  // namespace opd::onednn
