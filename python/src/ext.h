// Shared helpers of the _bagua_ext Python extension: Status -> Python exception, the binders of
// each part.
//
// The extension never links libtorch: tensors cross as (data_ptr, numel, dtype code, device),
// so one build serves every torch version that runs on the interpreter it was built for.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "bagua/base/status.h"

namespace bagua::core {
class ProcessGroup;
}

namespace bagua::py {

namespace pyb = pybind11;

// Raises RuntimeError("<Code>: <message> ...") for a failed Status.
inline void check(const Status& s) {
  if (!s.isOk()) {
    throw std::runtime_error(s.toString());
  }
}

template <typename T>
T take(Result<T>&& r) {
  if (!r.isOk()) {
    throw std::runtime_error(r.status().toString());
  }
  return std::move(r).value();
}

void bindComm(pyb::module_& m);
// The ProcessGroup of a _bagua_ext.Group object (TypeError for anything else).
core::ProcessGroup& groupOf(const pyb::object& group);
void bindDdp(pyb::module_& m);
void bindContrib(pyb::module_& m);

}  // namespace bagua::py
