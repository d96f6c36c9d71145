#include "bagua/loader/progress.h"

#include <unistd.h>

#include <cmath>

#include "bagua/base/status.h"

namespace bagua::loader {

std::string formatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) {
    return "--:--:--";
  }
  auto s = static_cast<uint64_t>(seconds + 0.5);
  return strPrintf("%02llu:%02llu:%02llu", static_cast<unsigned long long>(s / 3600),
                   static_cast<unsigned long long>(s / 60 % 60),
                   static_cast<unsigned long long>(s % 60));
}

ProgressMeter::ProgressMeter(FILE* out, std::string label, uint64_t total, ProgressOptions options)
    : out_(out), label_(std::move(label)), total_(total), options_(std::move(options)) {
  switch (options_.mode) {
  case ProgressOptions::Mode::kTty:
    tty_ = true;
    break;
  case ProgressOptions::Mode::kLines:
    tty_ = false;
    break;
  case ProgressOptions::Mode::kAuto:
    tty_ = out_ != nullptr && isatty(fileno(out_)) == 1;
    break;
  }
  start_ = now();
  lastDraw_ = start_;
}

ProgressMeter::~ProgressMeter() {
  finish();
}

double ProgressMeter::now() const {
  if (options_.clock) {
    return options_.clock();
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void ProgressMeter::add(uint64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  done_ += n;
  if (out_ == nullptr || finished_) {
    return;
  }
  double t = now();
  double interval = tty_ ? options_.ttyIntervalSeconds : options_.lineIntervalSeconds;
  if (t - lastDraw_ >= interval) {
    drawLocked(t, false);
  }
}

void ProgressMeter::finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) {
    return;
  }
  finished_ = true;
  if (out_ != nullptr) {
    drawLocked(now(), true);
  }
}

uint64_t ProgressMeter::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

double ProgressMeter::rate() const {
  std::lock_guard<std::mutex> lock(mu_);
  double dt = now() - start_;
  return dt > 0 ? static_cast<double>(done_) / dt : 0.0;
}

std::string ProgressMeter::line() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lineLocked(now());
}

std::string ProgressMeter::lineLocked(double t) const {
  const double elapsed = t - start_;
  const double rate = elapsed > 0 ? static_cast<double>(done_) / elapsed : 0.0;
  std::string s = label_;
  if (!s.empty()) {
    s += "  ";
  }
  if (total_ > 0) {
    s += strPrintf("%llu/%llu %s  %5.1f%%", static_cast<unsigned long long>(done_),
                   static_cast<unsigned long long>(total_), options_.unit.c_str(),
                   100.0 * static_cast<double>(done_) / static_cast<double>(total_));
  } else {
    s += strPrintf("%llu %s", static_cast<unsigned long long>(done_), options_.unit.c_str());
  }
  s += strPrintf("  %.1f %s/s  elapsed %s", rate, options_.unit.c_str(),
                 formatDuration(elapsed).c_str());
  if (total_ > 0) {
    double eta = -1;
    if (done_ >= total_) {
      eta = 0;
    } else if (rate > 0) {
      eta = static_cast<double>(total_ - done_) / rate;
    }
    s += "  ETA " + formatDuration(eta);
  }
  return s;
}

void ProgressMeter::drawLocked(double t, bool final) {
  std::string s = lineLocked(t);
  lastDraw_ = t;
  if (tty_) {
    // Pad with spaces so a shorter line fully covers the previous one.
    size_t width = s.size();
    if (width < lastWidth_) {
      s.append(lastWidth_ - width, ' ');
    }
    lastWidth_ = width;
    std::fprintf(out_, "\r%s%s", s.c_str(), final ? "\n" : "");
  } else {
    std::fprintf(out_, "%s\n", s.c_str());
  }
  std::fflush(out_);
}

}  // namespace bagua::loader
