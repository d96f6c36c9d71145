// Helpers shared by the net_plugin tests: byte patterns, bounded waits, the plugin's path and a
// capture of what the plugin logs through the logger NCCL hands it.
#pragma once

#include <chrono>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bagua/base/params.h"
#include "bagua/base/status.h"
#include "nccl_net_abi.h"

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

// The built libnccl-net.so, from meson (BAGUA_NET_PLUGIN_PATH); "" when run outside meson test.
inline std::string pluginPath() {
  return bagua::processEnv("BAGUA_NET_PLUGIN_PATH").value_or("");
}

// Lines the plugin sent through the NCCL logger ("<level> <flags> <file>:<line> <message>"), kept
// for the whole process (a forked child has its own copy). Thread-safe.
struct LogCapture {
  std::mutex mu;
  std::vector<std::string> lines;
};

inline LogCapture& logCapture() {
  static LogCapture capture;
  return capture;
}

// An ncclDebugLogger_t to hand to the plugin's init.
inline void captureLogger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                          const char* fmt, ...) __attribute__((format(printf, 5, 6)));
inline void captureLogger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                          const char* fmt, ...) {
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  LogCapture& c = logCapture();
  std::lock_guard<std::mutex> lock(c.mu);
  c.lines.push_back(bagua::strPrintf("%d %lx %s:%d %s", static_cast<int>(level), flags,
                                     file != nullptr ? file : "?", line, buf));
}

inline bool logContains(const std::string& needle) {
  LogCapture& c = logCapture();
  std::lock_guard<std::mutex> lock(c.mu);
  for (const std::string& l : c.lines) {
    if (l.find(needle) != std::string::npos) {
      return true;
    }
  }
  return false;
}

// Every captured line, one per line.
inline std::string logText() {
  LogCapture& c = logCapture();
  std::lock_guard<std::mutex> lock(c.mu);
  std::string out;
  for (const std::string& l : c.lines) {
    out += l + "\n";
  }
  return out;
}

}  // namespace bagua::net::testing
