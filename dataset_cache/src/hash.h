// Key hashing shared by the embedded shards and the Redis cluster mode. Our own function (FNV-1a
// over the bytes, then a 64-bit finaliser so that every input bit reaches the high bits used to
// pick a shard); stable across runs and machines, so every rank maps a key to the same server.
#pragma once

#include <cstdint>
#include <string_view>

namespace bagua::cache::detail {

inline uint64_t hashKey(std::string_view key) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : key) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

}  // namespace bagua::cache::detail
