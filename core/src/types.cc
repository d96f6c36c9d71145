#include "bagua/core/types.h"

#include <cstring>
#include <limits>

namespace bagua::core {

size_t dataTypeSize(DataType dtype) {
  switch (dtype) {
  case DataType::kF32:
  case DataType::kI32:
    return 4;
  case DataType::kF16:
  case DataType::kBF16:
    return 2;
  case DataType::kF64:
  case DataType::kI64:
    return 8;
  case DataType::kU8:
    return 1;
  }
  return 1;
}

const char* dataTypeName(DataType dtype) {
  switch (dtype) {
  case DataType::kF32:
    return "f32";
  case DataType::kF16:
    return "f16";
  case DataType::kBF16:
    return "bf16";
  case DataType::kF64:
    return "f64";
  case DataType::kI32:
    return "i32";
  case DataType::kI64:
    return "i64";
  case DataType::kU8:
    return "u8";
  }
  return "?";
}

const char* reduceOpName(ReduceOp op) {
  switch (op) {
  case ReduceOp::kSum:
    return "sum";
  case ReduceOp::kAvg:
    return "avg";
  case ReduceOp::kMin:
    return "min";
  case ReduceOp::kMax:
    return "max";
  case ReduceOp::kProduct:
    return "product";
  }
  return "?";
}

const char* deviceTypeName(DeviceType type) {
  return type == DeviceType::kCpu ? "cpu" : "cuda";
}

uint16_t floatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
  }
  if (absx >= 0x477ff000u) {  // rounds to >= 65520: overflow to inf
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (absx < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    if (absx < 0x33000000u) {
      return static_cast<uint16_t>(sign);
    }
    const uint32_t exp = absx >> 23;
    const uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 14 + (112 - exp) ... aligns to 2^-24 units
    const uint32_t rounded = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    uint32_t h = rounded;
    if (rem > half || (rem == half && (rounded & 1u))) {
      ++h;
    }
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = ((absx - 0x38000000u) >> 13);
  const uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) {
    ++h;
  }
  return static_cast<uint16_t>(sign | h);
}

float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      x = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

uint16_t floatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  }
  const uint32_t lsb = (x >> 16) & 1u;
  x += 0x7fffu + lsb;
  return static_cast<uint16_t>(x >> 16);
}

float bf16ToFloat(uint16_t b) {
  const uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

Result<size_t> byteSize(size_t count, DataType dtype, const char* what) {
  const size_t es = dataTypeSize(dtype);
  if (count > std::numeric_limits<size_t>::max() / es) {
    return BAGUA_ERROR(kInvalidArgument, "%s: %zu elements of %s overflow the address space", what,
                       count, dataTypeName(dtype));
  }
  return count * es;
}

}  // namespace bagua::core
