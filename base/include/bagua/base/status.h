// Status and Result<T>: the error model of every bagua library.
//
// Internal APIs return [[nodiscard]] Status or Result<T>; hot paths never throw. A Status carries
// a code, a message with context (peer, sizes, which bucket) and the file:line where it was made.
// Propagate with BAGUA_RETURN_IF_ERROR / BAGUA_ASSIGN_OR_RETURN; each frame the error passes
// through is appended to a short trace (NCCL's "-> error" backtrace idea) so a failure deep in
// the transport reads as a chain up to the API the user called.
//
// Thread safety: values; no shared state.
#pragma once

#include <cstdarg>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace bagua {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,     // the caller passed something wrong (bad value, bad size)
  kFailedPrecondition,  // the call is not valid in the current state
  kUnavailable,         // transient: retry later (EAGAIN, queue full, not connected yet)
  kAborted,             // the operation was aborted on request
  kDeadlineExceeded,    // a bounded wait ran out
  kRemoteError,         // the peer closed, reset or sent something invalid
  kSystemError,         // an OS call failed (errno)
  kCudaError,
  kNcclError,
  kNotFound,
  kResourceExhausted,
  kInternal,  // a bug in bagua
};

// Short stable name of a code, e.g. "RemoteError".
const char* statusCodeName(StatusCode code);

// printf into a std::string; format checked at compile time.
std::string strPrintf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string strVPrintf(const char* fmt, va_list args);

class [[nodiscard]] Status {
 public:
  Status() = default;  // Ok
  Status(StatusCode code, std::string message, const char* file = nullptr, int line = 0);

  static Status ok() { return Status(); }

  bool isOk() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return isOk(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "file:line" of origin, or empty.
  const std::string& origin() const { return origin_; }
  // "Code: message [origin] <- frame <- frame".
  std::string toString() const;

  // Adds a propagation frame (used by the macros) and returns *this for chaining.
  Status& addFrame(const char* file, int line);
  // Prepends context to the message: "context: message".
  Status& withContext(std::string_view context);

  // Explicitly ignore a status where failure does not matter (teardown paths).
  void ignore() const {}

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
  std::string origin_;
  std::string frames_;
};

// Makes a Status from errno-style error numbers: ECONNRESET/EPIPE/ECONNREFUSED map to
// kRemoteError, EAGAIN to kUnavailable, the rest to kSystemError. The message carries strerror.
Status errnoStatus(int err, std::string_view what, const char* file = nullptr, int line = 0);

// Result<T>: a T or a non-Ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  static_assert(!std::is_same_v<T, Status>, "Result<Status> makes no sense");

  Result(T value) : v_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (std::get<Status>(v_).isOk()) {
      v_ = Status(StatusCode::kInternal, "Result constructed from an Ok status");
    }
  }

  bool isOk() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return isOk(); }

  const Status& status() const {
    static const Status kOkStatus;
    return isOk() ? kOkStatus : std::get<Status>(v_);
  }
  Status takeStatus() { return isOk() ? Status() : std::move(std::get<Status>(v_)); }

  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  T valueOr(T fallback) const& { return isOk() ? std::get<T>(v_) : std::move(fallback); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace bagua

#define BAGUA_STATUS_CONCAT_INNER(a, b) a##b
#define BAGUA_STATUS_CONCAT(a, b) BAGUA_STATUS_CONCAT_INNER(a, b)

// Makes a Status with a printf-formatted message and the caller's location.
#define BAGUA_ERROR(code, ...) \
  ::bagua::Status(::bagua::StatusCode::code, ::bagua::strPrintf(__VA_ARGS__), __FILE__, __LINE__)

// Makes a Status from an errno value with the caller's location.
#define BAGUA_ERRNO(err, what) ::bagua::errnoStatus((err), (what), __FILE__, __LINE__)

// Returns the status of `expr` from the enclosing function if it is not Ok.
#define BAGUA_RETURN_IF_ERROR(expr)                                 \
  do {                                                              \
    ::bagua::Status bagua_status_ = (expr);                         \
    if (!bagua_status_.isOk()) {                                    \
      return std::move(bagua_status_.addFrame(__FILE__, __LINE__)); \
    }                                                               \
  } while (0)

#define BAGUA_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr)          \
  auto tmp = (expr);                                         \
  if (!tmp.isOk()) {                                         \
    ::bagua::Status bagua_s_ = tmp.takeStatus();             \
    return std::move(bagua_s_.addFrame(__FILE__, __LINE__)); \
  }                                                          \
  lhs = std::move(tmp).value()

// `BAGUA_ASSIGN_OR_RETURN(auto x, f());` declares x from f()'s value or returns its status.
#define BAGUA_ASSIGN_OR_RETURN(lhs, expr) \
  BAGUA_ASSIGN_OR_RETURN_IMPL(BAGUA_STATUS_CONCAT(bagua_result_, __LINE__), lhs, expr)

// Invariant check (never for caller input): aborts with the condition and a message.
#define BAGUA_ASSERT(cond, ...)                                                                \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      ::bagua::detail::assertFail(#cond, __FILE__, __LINE__, ::bagua::strPrintf(__VA_ARGS__)); \
    }                                                                                          \
  } while (0)

namespace bagua::detail {
[[noreturn]] void assertFail(const char* cond, const char* file, int line, const std::string& msg);
}  // namespace bagua::detail
