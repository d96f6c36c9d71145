// Element types, reduction operations and devices shared by every communicator.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "bagua/base/status.h"

namespace bagua::core {

enum class DataType : int { kF32 = 0, kF16, kBF16, kF64, kI32, kI64, kU8 };
inline constexpr int kNumDataTypes = 7;

enum class ReduceOp : int { kSum = 0, kAvg, kMin, kMax, kProduct };
inline constexpr int kNumReduceOps = 5;

enum class DeviceType : int { kCpu = 0, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;
  bool operator==(const Device&) const = default;
};

// Bytes per element.
size_t dataTypeSize(DataType dtype);
// "f32", "f16", "bf16", "f64", "i32", "i64", "u8".
const char* dataTypeName(DataType dtype);
// "sum", "avg", "min", "max", "product".
const char* reduceOpName(ReduceOp op);
// "cpu" or "cuda:N" (static storage per call is not used: returns a short string by value).
const char* deviceTypeName(DeviceType type);

// IEEE binary16 and bfloat16 conversions (round to nearest even; NaN kept NaN).
uint16_t floatToHalf(float f);
float halfToFloat(uint16_t h);
uint16_t floatToBf16(float f);
float bf16ToFloat(uint16_t b);

// Checks `count * dataTypeSize(dtype)` does not overflow; InvalidArgument naming `what`.
Result<size_t> byteSize(size_t count, DataType dtype, const char* what);

}  // namespace bagua::core
