// Levelled, categorised logging, filtered before formatting.
//
// Configuration (baseParams(), declared below): BAGUA_LOG_LEVEL (global threshold, default warn),
// BAGUA_LOG_SUBSYS (per-category thresholds, "net:debug,bucket:info"), BAGUA_LOG_FILE (path;
// %h expands to the host name, %p to the pid; default stderr). Read once, on first use.
//
// A sink can replace the default writer: the NCCL plugin routes every line through the logger
// NCCL hands to init(), so plugin output shows under NCCL_DEBUG=INFO like NCCL's own transports.
//
// Thread safety: all functions may be called from any thread. The sink is called without locks
// held by the logger; the default sink writes one line per call with a single write().
#pragma once

#include <cstdarg>
#include <functional>
#include <string>
#include <vector>

#include "bagua/base/params.h"
#include "bagua/base/status.h"

namespace bagua {

enum class LogLevel : int { kTrace = 0, kDebug, kInfo, kWarn, kError, kOff };

// A log category: a name with its own threshold. Base knows no client's categories: each library
// declares its own once, as a constant in one of its headers,
//
//   namespace bagua::net { inline const LogCategory kLogNet{"net"}; }
//
// and logs with BAGUA_LOG_INFO(kLogNet, ...). Constructing one registers the name (a name
// registered twice, from two libraries or two copies of a header, shares one threshold); at most
// kMaxLogCategories names per process. BAGUA_LOG_SUBSYS accepts the names registered in the
// process that reads it.
class LogCategory {
 public:
  static constexpr int kMaxLogCategories = 32;

  explicit LogCategory(const char* name);

  int id() const { return id_; }
  const char* name() const;
  bool operator==(const LogCategory& other) const { return id_ == other.id_; }

 private:
  int id_;
};

// Base's own categories: start-up and configuration (parameters, environment).
inline const LogCategory kLogInit{"init"};
inline const LogCategory kLogEnv{"env"};

// The names registered so far, in registration order.
std::vector<std::string> logCategoryNames();

const char* logLevelName(LogLevel level);

// True when a message of this level and category would be written. Cheap (one atomic load after
// the first call); call it before formatting anything.
bool logEnabled(LogLevel level, const LogCategory& category);

// Formats and writes a message (callers normally use the BAGUA_LOG_* macros).
void logMessage(LogLevel level, const LogCategory& category, const char* file, int line,
                const char* fmt, ...) __attribute__((format(printf, 5, 6)));

// Replaces where formatted lines go; nullptr restores the default writer. `message` has no
// prefix and no newline.
using LogSink = std::function<void(LogLevel level, const LogCategory& category, const char* file,
                                   int line, const std::string& message)>;
void setLogSink(LogSink sink);

// Base's own knobs (logging), in the one catalogue idiom (bagua/base/params.h).
// Checks a BAGUA_LOG_SUBSYS value: "category:level" pairs, levels known, categories registered.
Status validateLogSubsys(const std::string& value);

struct BaseParams : ParamCatalogue {
  BaseParams() : ParamCatalogue("base", "logging shared by every bagua library") {}

  EnumParam logLevel{*this,
                     "BAGUA_LOG_LEVEL",
                     "warn",
                     {{"trace", "everything, when built with -Dtrace=true"},
                      {"debug", "per-connection and per-bucket detail"},
                      {"info", "set-up decisions and parameter overrides"},
                      {"warn", "problems that bagua works around"},
                      {"error", "failures"},
                      {"off", "nothing"}},
                     "Global log threshold."};
  StringParam logSubsys{*this,
                        "BAGUA_LOG_SUBSYS",
                        "",
                        "Per-category thresholds that override BAGUA_LOG_LEVEL, e.g. "
                        "\"net:debug,bucket:info\".",
                        "comma-separated category:level pairs; category 'all' or one that a "
                        "library of the process registered (an unknown one is named in the "
                        "error with the registered ones); levels: trace, debug, info, warn, "
                        "error, off",
                        validateLogSubsys};
  StringParam logFile{*this, "BAGUA_LOG_FILE", "",
                      "Write log lines to this file instead of stderr; %h expands to the host "
                      "name, %p to the pid.",
                      "a file path (may contain %h and %p)"};
};
BaseParams& baseParams();

// Re-reads the logging parameters (after tests change them). Returns an error on a bad value,
// in which case the defaults stay in force.
Status configureLogging();

// Forces a threshold (tools and tests); overrides the parameters until the next configure.
void setLogLevel(LogLevel level);
void setLogLevel(const LogCategory& category, LogLevel level);

// The rank shown in the line prefix (-1: none).
void setLogRank(int rank);

}  // namespace bagua

// `category` is a LogCategory (an expression, usually a library's kLog* constant).
#define BAGUA_LOG(level, category, ...)                                                           \
  do {                                                                                            \
    if (::bagua::logEnabled(::bagua::LogLevel::level, (category))) {                              \
      ::bagua::logMessage(::bagua::LogLevel::level, (category), __FILE__, __LINE__, __VA_ARGS__); \
    }                                                                                             \
  } while (0)

#define BAGUA_LOG_ERROR(category, ...) BAGUA_LOG(kError, category, __VA_ARGS__)
#define BAGUA_LOG_WARN(category, ...) BAGUA_LOG(kWarn, category, __VA_ARGS__)
#define BAGUA_LOG_INFO(category, ...) BAGUA_LOG(kInfo, category, __VA_ARGS__)
#define BAGUA_LOG_DEBUG(category, ...) BAGUA_LOG(kDebug, category, __VA_ARGS__)
#if defined(BAGUA_ENABLE_TRACE) && BAGUA_ENABLE_TRACE
#define BAGUA_LOG_TRACE(category, ...) BAGUA_LOG(kTrace, category, __VA_ARGS__)
#else
#define BAGUA_LOG_TRACE(category, ...) \
  do {                                 \
  } while (0)
#endif
