#include "bagua/base/status.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace bagua {

const char* statusCodeName(StatusCode code) {
  switch (code) {
  case StatusCode::kOk:
    return "Ok";
  case StatusCode::kInvalidArgument:
    return "InvalidArgument";
  case StatusCode::kFailedPrecondition:
    return "FailedPrecondition";
  case StatusCode::kUnavailable:
    return "Unavailable";
  case StatusCode::kAborted:
    return "Aborted";
  case StatusCode::kDeadlineExceeded:
    return "DeadlineExceeded";
  case StatusCode::kRemoteError:
    return "RemoteError";
  case StatusCode::kSystemError:
    return "SystemError";
  case StatusCode::kCudaError:
    return "CudaError";
  case StatusCode::kNcclError:
    return "NcclError";
  case StatusCode::kNotFound:
    return "NotFound";
  case StatusCode::kResourceExhausted:
    return "ResourceExhausted";
  case StatusCode::kInternal:
    return "Internal";
  }
  return "Unknown";
}

std::string strVPrintf(const char* fmt, va_list args) {
  va_list copy;
  va_copy(copy, args);
  char small[256];
  int n = std::vsnprintf(small, sizeof(small), fmt, copy);
  va_end(copy);
  if (n < 0) {
    return std::string(fmt);
  }
  if (static_cast<size_t>(n) < sizeof(small)) {
    return std::string(small, static_cast<size_t>(n));
  }
  std::string out(static_cast<size_t>(n), '\0');
  std::vsnprintf(out.data(), out.size() + 1, fmt, args);
  return out;
}

std::string strPrintf(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::string out = strVPrintf(fmt, args);
  va_end(args);
  return out;
}

namespace {
std::string location(const char* file, int line) {
  if (file == nullptr) {
    return {};
  }
  const char* base = std::strrchr(file, '/');
  return strPrintf("%s:%d", base != nullptr ? base + 1 : file, line);
}
}  // namespace

Status::Status(StatusCode code, std::string message, const char* file, int line)
    : code_(code), message_(std::move(message)), origin_(location(file, line)) {}

std::string Status::toString() const {
  if (isOk()) {
    return "Ok";
  }
  std::string out = strPrintf("%s: %s", statusCodeName(code_), message_.c_str());
  if (!origin_.empty()) {
    out += " [" + origin_ + "]";
  }
  out += frames_;
  return out;
}

Status& Status::addFrame(const char* file, int line) {
  // Keep the trace short: a chain of 8 frames tells the story; more is noise.
  constexpr size_t kMaxFrameChars = 160;
  if (frames_.size() < kMaxFrameChars) {
    frames_ += " <- " + location(file, line);
  }
  return *this;
}

Status& Status::withContext(std::string_view context) {
  message_ = std::string(context) + ": " + message_;
  return *this;
}

Status errnoStatus(int err, std::string_view what, const char* file, int line) {
  StatusCode code = StatusCode::kSystemError;
  switch (err) {
  case ECONNRESET:
  case EPIPE:
  case ECONNREFUSED:
  case ECONNABORTED:
  case EHOSTUNREACH:
  case ENETUNREACH:
    code = StatusCode::kRemoteError;
    break;
  case EAGAIN:
    code = StatusCode::kUnavailable;
    break;
  case ETIMEDOUT:
    code = StatusCode::kDeadlineExceeded;
    break;
  default:
    break;
  }
  char buf[128];
  // GNU strerror_r returns the message pointer (maybe not buf).
  const char* text = strerror_r(err, buf, sizeof(buf));
  return Status(
      code, strPrintf("%.*s: %s (errno %d)", static_cast<int>(what.size()), what.data(), text, err),
      file, line);
}

namespace detail {
void assertFail(const char* cond, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "bagua: assertion failed at %s:%d: %s: %s\n", file, line, cond, msg.c_str());
  std::fflush(stderr);
  std::abort();
}
}  // namespace detail

}  // namespace bagua
