// ProgressMeter: samples/s and ETA for long loops (data loader epochs, the training demo).
//
// Renders to a FILE*. On a terminal it rewrites one line with '\r' at most every
// ttyIntervalSeconds; elsewhere (a log file, CI) it prints a full line at most every
// lineIntervalSeconds, so logs stay short. finish() prints the final line either way.
//
//   epoch 3  1200/5000 samples  24.0%  812.3 samples/s  elapsed 00:00:01  ETA 00:00:04
//
// The clock is injectable so tests can drive time. Thread safety: all methods lock an internal
// mutex, so several threads may add(); output happens on the calling thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>

namespace bagua::loader {

struct ProgressOptions {
  enum class Mode { kAuto, kTty, kLines };
  Mode mode = Mode::kAuto;          // kAuto: isatty(fileno(out))
  double ttyIntervalSeconds = 0.2;  // minimum time between '\r' redraws on a terminal
  double lineIntervalSeconds = 10;  // minimum time between lines elsewhere
  std::string unit = "samples";
  // Seconds since an arbitrary origin; default std::chrono::steady_clock.
  std::function<double()> clock;
};

class ProgressMeter {
 public:
  // `out` is borrowed (not closed); nullptr disables output. total 0 means unknown (no ETA).
  ProgressMeter(FILE* out, std::string label, uint64_t total, ProgressOptions options = {});
  ~ProgressMeter();
  ProgressMeter(const ProgressMeter&) = delete;
  ProgressMeter& operator=(const ProgressMeter&) = delete;

  // Counts `n` more units done and redraws if the interval has passed.
  void add(uint64_t n);
  // Prints the final line (ending the '\r' line with a newline on a terminal). Idempotent;
  // the destructor calls it.
  void finish();

  uint64_t done() const;
  // Units per second since construction (0 before any time has passed).
  double rate() const;
  // The text of the current status line (no '\r' or newline).
  std::string line() const;
  bool isTty() const { return tty_; }

 private:
  double now() const;
  std::string lineLocked(double t) const;
  void drawLocked(double t, bool final);

  FILE* out_;
  std::string label_;
  uint64_t total_;
  ProgressOptions options_;
  bool tty_ = false;
  double start_ = 0;
  mutable std::mutex mu_;
  uint64_t done_ = 0;      // guarded by mu_
  double lastDraw_ = 0;    // guarded by mu_
  bool finished_ = false;  // guarded by mu_
  size_t lastWidth_ = 0;   // guarded by mu_; to blank a shorter '\r' line
};

// "hh:mm:ss" (or "--:--:--" for a negative or non-finite value).
std::string formatDuration(double seconds);

}  // namespace bagua::loader
