#include "bagua/loader/dataset.h"

namespace bagua::loader {

Status VectorDataset::get(size_t index, Sample& out) const {
  if (index >= samples_.size()) {
    return BAGUA_ERROR(kInvalidArgument, "sample index %zu out of range: the dataset has %zu",
                       index, samples_.size());
  }
  out.assign(samples_[index].begin(), samples_[index].end());
  return Status::ok();
}

Status FunctionDataset::get(size_t index, Sample& out) const {
  if (index >= size_) {
    return BAGUA_ERROR(kInvalidArgument, "sample index %zu out of range: the dataset has %zu",
                       index, size_);
  }
  return fn_(index, out);
}

}  // namespace bagua::loader
