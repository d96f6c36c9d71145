// Memory of the fused optimizer's tensors and states on their device: a 64-byte aligned, zeroed
// heap block on the CPU, cuda.h's calls on a CUDA device (copies to and from the host wait for
// them; see cuda.h for the stream). Every call runs on the caller's thread. Private to
// optimizer/src (fused_*.cc).
#pragma once

#include <cstddef>
#include <string>

#include "bagua/base/status.h"
#include "bagua/core/types.h"
#include "bagua/optimizer/kernel_args.h"

namespace bagua::optim::detail {

// Bytes of one state element: states are f64 for f64 parameters, else f32.
size_t stateElemSize(StorageType s);
bool isHalfLike(StorageType s);

// `bytes` rounded up to 64 (at least 64), zeroed. Free with deviceFree on the same device.
Result<void*> deviceAlloc(const core::Device& d, size_t bytes);
void deviceFree(const core::Device& d, void* p);
// Copies within the device (overlap allowed on the CPU), to the host and from the host.
Status copyOn(const core::Device& d, void* dst, const void* src, size_t bytes);
Status toHost(const core::Device& d, void* dst, const void* src, size_t bytes);
Status fromHost(const core::Device& d, void* dst, const void* src, size_t bytes);
Status zeroOn(const core::Device& d, void* p, size_t bytes);
// Fills `numel` state elements (f32, or f64 for kF64 storage) with `value`.
Status fillState(const core::Device& d, void* p, size_t numel, StorageType s, double value);
// f32 master weights from `numel` 16-bit parameter values (kF16 or kBF16).
Status initMaster(const core::Device& d, float* master, const void* param, size_t numel,
                  StorageType s);
// "cpu" or "cuda:N", for messages.
std::string deviceString(const core::Device& d);

}  // namespace bagua::optim::detail
