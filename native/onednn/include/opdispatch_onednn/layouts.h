// Reorders between memory formats (the layout converters of the oneDNN backend).
#pragma once

#include <string>

#include "opdispatch_onednn/common.h"

namespace opd::onednn {

// The physical shape of a tensor of logical `dims` held in format `tag`.
Dims tag_physical_shape(const Dims& dims, const std::string& tag);

// Copies the tensor of logical `dims` from format `src_tag` (buffer `src`) to format
// `dst_tag` (buffer `dst`, tag_physical_shape(dims, dst_tag) elements), zero-filling padding.
// Reorder primitives are cached per (dims, tags), so a converter run per inference does not
// create one each time.
void reorder(const Dims& dims, const std::string& src_tag, const std::string& dst_tag,
             const float* src, float* dst);

}  // namespace opd::onednn
