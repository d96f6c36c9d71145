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
class DistributedDataParallel;
class ProcessGroup;
}  // namespace bagua::core

namespace bagua::py {

namespace pyb = pybind11;

// A failed Status as a Python exception carrying "<Code>: <message> ...": InvalidArgument
// raises _bagua_ext.InvalidArgumentError, a ValueError that is also a RuntimeError (Bagua's API
// raises ValueError for bad arguments; code that catches RuntimeError still catches it), every
// other code RuntimeError. registerExceptions() makes the Python class.
class InvalidArgumentError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void raise(const Status& s) {
  if (s.code() == StatusCode::kInvalidArgument) {
    throw InvalidArgumentError(s.toString());
  }
  throw std::runtime_error(s.toString());
}

inline void check(const Status& s) {
  if (!s.isOk()) {
    raise(s);
  }
}

template <typename T>
T take(Result<T>&& r) {
  if (!r.isOk()) {
    raise(r.status());
  }
  return std::move(r).value();
}

void registerExceptions(pyb::module_& m);

void bindComm(pyb::module_& m);
// The ProcessGroup of a _bagua_ext.Group object (TypeError for anything else).
core::ProcessGroup& groupOf(const pyb::object& group);
void bindDdp(pyb::module_& m);
// The reducer of a _bagua_ext.Reducer object (TypeError for anything else).
core::DistributedDataParallel& reducerOf(const pyb::object& reducer);
// Gradient-ready hooks in C++ (ext_hooks.cc).
void bindHooks(pyb::module_& m);
void bindContrib(pyb::module_& m);
// Bagua-Net's parameter catalogues, validated by the plugin's parsers (ext_params.cc).
void bindParams(pyb::module_& m);

}  // namespace bagua::py
