// Levelled, categorised logging, filtered before formatting.
//
// Configuration (baseParams()): BAGUA_LOG_LEVEL (global threshold, default warn),
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

#include "bagua/base/status.h"

namespace bagua {

enum class LogLevel : int { kTrace = 0, kDebug, kInfo, kWarn, kError, kOff };

enum class LogCategory : int {
  kInit = 0,
  kEnv,
  kNet,
  kCore,
  kBucket,
  kAlgo,
  kCache,
  kLoader,
  kTune,
  kTool,
  kCount,
};

const char* logLevelName(LogLevel level);
const char* logCategoryName(LogCategory category);

// True when a message of this level and category would be written. Cheap (one atomic load after
// the first call); call it before formatting anything.
bool logEnabled(LogLevel level, LogCategory category);

// Formats and writes a message (callers normally use the BAGUA_LOG_* macros).
void logMessage(LogLevel level, LogCategory category, const char* file, int line, const char* fmt,
                ...) __attribute__((format(printf, 5, 6)));

// Replaces where formatted lines go; nullptr restores the default writer. `message` has no
// prefix and no newline.
using LogSink = std::function<void(LogLevel level, LogCategory category, const char* file, int line,
                                   const std::string& message)>;
void setLogSink(LogSink sink);

// Re-reads the logging parameters (after tests change them). Returns an error on a bad value,
// in which case the defaults stay in force.
Status configureLogging();

// Forces a threshold (tools and tests); overrides the parameters until the next configure.
void setLogLevel(LogLevel level);
void setLogLevel(LogCategory category, LogLevel level);

// The rank shown in the line prefix (-1: none).
void setLogRank(int rank);

}  // namespace bagua

#define BAGUA_LOG(level, category, ...)                                                       \
  do {                                                                                        \
    if (::bagua::logEnabled(::bagua::LogLevel::level, ::bagua::LogCategory::category)) {      \
      ::bagua::logMessage(::bagua::LogLevel::level, ::bagua::LogCategory::category, __FILE__, \
                          __LINE__, __VA_ARGS__);                                             \
    }                                                                                         \
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
