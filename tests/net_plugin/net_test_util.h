// Helpers shared by the net_plugin tests: byte patterns and bounded waits.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

namespace bagua::net::testing {

// A pattern that depends on the message id and the byte index, so misplaced, swapped or stale
// bytes are caught.
inline uint8_t patternByte(uint64_t message, size_t index) {
  uint64_t x = (message + 1) * 0x9e3779b97f4a7c15ULL + index * 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 29;
  return static_cast<uint8_t>(x ^ (index >> 8));
}

inline void fillPattern(std::vector<uint8_t>& buf, uint64_t message) {
  for (size_t i = 0; i < buf.size(); ++i) {
    buf[i] = patternByte(message, i);
  }
}

// Index of the first byte that differs from the pattern, or -1.
inline long long firstMismatch(const uint8_t* data, size_t size, uint64_t message) {
  for (size_t i = 0; i < size; ++i) {
    if (data[i] != patternByte(message, i)) {
      return static_cast<long long>(i);
    }
  }
  return -1;
}

// Polls `fn` (returns true when finished) until it does or `seconds` pass; false on timeout.
template <typename Fn>
bool pollFor(double seconds, Fn fn) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (fn()) {
      return true;
    }
    std::this_thread::yield();
  }
  return fn();
}

}  // namespace bagua::net::testing
