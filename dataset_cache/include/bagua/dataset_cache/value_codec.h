// A typed encoding of cached samples: what a sample usually is (None, booleans, integers,
// floats, strings, bytes, lists, tuples, dicts and n-dimensional arrays such as tensors) as a
// tree of tagged items, decoded without running any code. The Python front end's cache stores
// its samples this way (python/bagua/torch_api/contrib/utils/codec.py): Python's pickle runs
// code while loading, and a cache that another process can write (a Redis server) must never
// be unpickled.
//
// Bytes: "BGV1", then one item in pre-order; every integer little endian.
//   tag u8: 0 None, 1 False, 2 True, 3 int (i64), 4 float (f64), 5 str (u64 length + UTF-8),
//   6 bytes (u64 length + bytes), 7 list / 8 tuple (u64 count, then the elements), 9 dict (u64
//   pairs, then key, value, key, value, ...), 10 array (element type u8, flavor u8, dims u8, each
//   dim u64, then the elements in C order).
// decode() checks everything against the bytes it was given before believing it: lengths and
// counts against what is left (a count is never trusted to size an allocation), the nesting
// depth, the number of items, the array's element type and that its dims' product times the
// element size (overflow-checked) is the bytes that follow, UTF-8 validity, and that nothing
// trails the value. A value that fails is an InvalidArgument naming what was wrong: the cache
// counts it as a miss.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bagua/base/status.h"

namespace bagua::cache::codec {

inline constexpr std::string_view kMagic = "BGV1";

enum class Tag : uint8_t {
  kNone = 0,
  kFalse = 1,
  kTrue = 2,
  kInt = 3,
  kFloat = 4,
  kStr = 5,
  kBytes = 6,
  kList = 7,
  kTuple = 8,
  kDict = 9,
  kArray = 10,
};

// Element types of an array, with their sizes in bytes.
enum class Elem : uint8_t {
  kBool = 0,  // 1
  kU8 = 1,    // 1
  kI8 = 2,    // 1
  kI16 = 3,   // 2
  kI32 = 4,   // 4
  kI64 = 5,   // 8
  kF16 = 6,   // 2
  kBF16 = 7,  // 2
  kF32 = 8,   // 4
  kF64 = 9,   // 8
  kC64 = 10,  // 8 (two f32)
  kC128 = 11  // 16 (two f64)
};
// The size of an element type; 0 for a value that is not one.
size_t elemSize(uint8_t elem);

struct Item {
  Tag tag = Tag::kNone;
  int64_t integer = 0;          // kInt
  double real = 0;              // kFloat
  uint64_t count = 0;           // kList, kTuple: elements; kDict: key-value pairs
  std::string_view data;        // kStr, kBytes, kArray: the bytes (decode: a view into its input)
  uint8_t elem = 0;             // kArray: an Elem
  uint8_t flavor = 0;           // kArray: the caller's kind of array (Python: 0 tensor, 1 numpy)
  std::vector<uint64_t> shape;  // kArray
};

struct Limits {
  size_t maxDepth = 64;
  size_t maxItems = size_t{1} << 22;
  size_t maxDims = 32;
};

// True when `bytes` starts with kMagic (a value of this codec, well-formed or not).
bool isTyped(std::string_view bytes);

// `items` in pre-order must form exactly one value (containers followed by their elements);
// InvalidArgument otherwise, or for an array whose data does not match its shape.
Result<std::string> encode(std::span<const Item> items);

// The items of one value, in pre-order, their data viewing into `bytes`.
Result<std::vector<Item>> decode(std::string_view bytes, const Limits& limits = {});

}  // namespace bagua::cache::codec
