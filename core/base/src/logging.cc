#include "bagua/base/logging.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>
#include <string_view>

#include "bagua/base/params.h"
#include "bagua/base/thread.h"

namespace bagua {

namespace {

constexpr std::array<const char*, static_cast<size_t>(LogCategory::kCount)> kCategoryNames = {
    "init", "env", "net", "core", "bucket", "algo", "cache", "loader", "tune", "tool"};
constexpr std::array<const char*, 6> kLevelNames = {"trace", "debug", "info",
                                                    "warn",  "error", "off"};

std::optional<LogLevel> levelFromName(std::string_view name) {
  for (size_t i = 0; i < kLevelNames.size(); ++i) {
    if (name == kLevelNames[i]) {
      return static_cast<LogLevel>(i);
    }
  }
  return std::nullopt;
}

std::optional<LogCategory> categoryFromName(std::string_view name) {
  for (size_t i = 0; i < kCategoryNames.size(); ++i) {
    if (name == kCategoryNames[i]) {
      return static_cast<LogCategory>(i);
    }
  }
  return std::nullopt;
}

// Parses "net:debug,bucket:info" into (category or all, level) pairs.
Status parseSubsys(std::string_view text,
                   std::vector<std::pair<std::optional<LogCategory>, LogLevel>>* out) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t comma = text.find(',', pos);
    std::string_view item =
        text.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
    pos = comma == std::string_view::npos ? text.size() : comma + 1;
    if (item.empty()) {
      continue;
    }
    size_t colon = item.find(':');
    if (colon == std::string_view::npos) {
      return BAGUA_ERROR(kInvalidArgument, "'%.*s' has no ':level'", static_cast<int>(item.size()),
                         item.data());
    }
    std::string_view cat = item.substr(0, colon);
    std::string_view lvl = item.substr(colon + 1);
    std::optional<LogLevel> level = levelFromName(lvl);
    if (!level) {
      return BAGUA_ERROR(kInvalidArgument, "unknown level '%.*s'", static_cast<int>(lvl.size()),
                         lvl.data());
    }
    if (cat == "all") {
      if (out != nullptr) {
        out->emplace_back(std::nullopt, *level);
      }
      continue;
    }
    std::optional<LogCategory> category = categoryFromName(cat);
    if (!category) {
      return BAGUA_ERROR(kInvalidArgument, "unknown category '%.*s'", static_cast<int>(cat.size()),
                         cat.data());
    }
    if (out != nullptr) {
      out->emplace_back(category, *level);
    }
  }
  return Status::ok();
}

std::string subsysAccepted() {
  std::string s = "comma-separated category:level pairs; categories: all";
  for (const char* c : kCategoryNames) {
    s += std::string(", ") + c;
  }
  s += "; levels: trace, debug, info, warn, error, off";
  return s;
}

struct LogParams {
  Param<std::string>& level;
  Param<std::string>& subsys;
  Param<std::string>& file;
};

LogParams& logParams() {
  static LogParams params = [] {
    ParamCatalogue& c = baseParams();
    return LogParams{*static_cast<Param<std::string>*>(c.find("BAGUA_LOG_LEVEL")),
                     *static_cast<Param<std::string>*>(c.find("BAGUA_LOG_SUBSYS")),
                     *static_cast<Param<std::string>*>(c.find("BAGUA_LOG_FILE"))};
  }();
  return params;
}

struct LoggerState {
  std::array<std::atomic<int>, static_cast<size_t>(LogCategory::kCount)> thresholds{};
  std::atomic<bool> configured{false};
  std::once_flag once;
  std::mutex sinkMu;
  LogSink sink;            // guarded by sinkMu
  int fd = STDERR_FILENO;  // guarded by sinkMu
  std::atomic<int> rank{-1};
};

LoggerState& state() {
  // Leaked on purpose: logging must work from destructors of other statics.
  static LoggerState* s = new LoggerState();
  return *s;
}

std::string expandPath(const std::string& pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size()) {
      char c = pattern[i + 1];
      if (c == 'h') {
        char host[256] = {};
        gethostname(host, sizeof(host) - 1);
        out += host;
        ++i;
        continue;
      }
      if (c == 'p') {
        out += std::to_string(getpid());
        ++i;
        continue;
      }
    }
    out += pattern[i];
  }
  return out;
}

Status applyConfiguration() {
  LoggerState& s = state();
  LogLevel global = LogLevel::kWarn;
  std::vector<std::pair<std::optional<LogCategory>, LogLevel>> subsys;
  Status status;
  Result<std::string> level = logParams().level.get();
  if (level.isOk()) {
    global = *levelFromName(*level);
  } else {
    status = level.status();
  }
  Result<std::string> sub = logParams().subsys.get();
  if (sub.isOk()) {
    parseSubsys(*sub, &subsys).ignore();  // validated by the parameter already
  } else if (status.isOk()) {
    status = sub.status();
  }
  for (auto& t : s.thresholds) {
    t.store(static_cast<int>(global), std::memory_order_relaxed);
  }
  for (const auto& [cat, lvl] : subsys) {
    if (cat.has_value()) {
      s.thresholds[static_cast<size_t>(*cat)].store(static_cast<int>(lvl),
                                                    std::memory_order_relaxed);
    } else {
      for (auto& t : s.thresholds) {
        t.store(static_cast<int>(lvl), std::memory_order_relaxed);
      }
    }
  }
  Result<std::string> file = logParams().file.get();
  {
    std::lock_guard<std::mutex> lock(s.sinkMu);
    if (s.fd != STDERR_FILENO) {
      ::close(s.fd);
      s.fd = STDERR_FILENO;
    }
    if (file.isOk() && !file->empty()) {
      std::string path = expandPath(*file);
      int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (fd >= 0) {
        s.fd = fd;
      } else if (status.isOk()) {
        status = BAGUA_ERRNO(errno, "BAGUA_LOG_FILE: cannot open " + path);
      }
    } else if (!file.isOk() && status.isOk()) {
      status = file.status();
    }
  }
  s.configured.store(true, std::memory_order_release);
  return status;
}

void ensureConfigured() {
  LoggerState& s = state();
  if (s.configured.load(std::memory_order_acquire)) {
    return;
  }
  std::call_once(s.once, [] {
    Status st = applyConfiguration();
    if (!st.isOk()) {
      // Report the bad knob once, through the normal path, so it is not lost.
      logMessage(LogLevel::kWarn, LogCategory::kEnv, __FILE__, __LINE__, "%s",
                 st.toString().c_str());
    }
  });
}

void defaultSink(int fd, LogLevel level, LogCategory category, const char* file, int line,
                 const std::string& message) {
  char host[64] = {};
  gethostname(host, sizeof(host) - 1);
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  tm tmv{};
  localtime_r(&ts.tv_sec, &tmv);
  int rank = state().rank.load(std::memory_order_relaxed);
  std::string prefix =
      strPrintf("%02d:%02d:%02d.%06ld %s:%d:%d [%s]", tmv.tm_hour, tmv.tm_min, tmv.tm_sec,
                ts.tv_nsec / 1000, host, getpid(), threadId(), threadName().c_str());
  if (rank >= 0) {
    prefix += strPrintf(" rank %d", rank);
  }
  std::string where;
  if (level >= LogLevel::kWarn && file != nullptr) {
    const char* base = std::strrchr(file, '/');
    where = strPrintf(" (%s:%d)", base != nullptr ? base + 1 : file, line);
  }
  std::string out = strPrintf("%s bagua %s %s: %s%s\n", prefix.c_str(), logLevelName(level),
                              logCategoryName(category), message.c_str(), where.c_str());
  // One write per line keeps lines from different threads whole.
  ssize_t n = ::write(fd, out.data(), out.size());
  (void)n;
}

}  // namespace

ParamCatalogue& baseParams() {
  static ParamCatalogue* catalogue = [] {
    auto* c = new ParamCatalogue("base", "logging shared by every bagua library");
    c->addEnum("BAGUA_LOG_LEVEL", "warn",
               {{"trace", "everything, when built with -Dtrace=true"},
                {"debug", "per-connection and per-bucket detail"},
                {"info", "set-up decisions and parameter overrides"},
                {"warn", "problems that bagua works around"},
                {"error", "failures"},
                {"off", "nothing"}},
               "Global log threshold.");
    c->addString("BAGUA_LOG_SUBSYS", "",
                 "Per-category thresholds that override BAGUA_LOG_LEVEL, e.g. "
                 "\"net:debug,bucket:info\".",
                 subsysAccepted(), [](const std::string& v) { return parseSubsys(v, nullptr); });
    c->addString("BAGUA_LOG_FILE", "",
                 "Write log lines to this file instead of stderr; %h expands to the host name, "
                 "%p to the pid.",
                 "a file path (may contain %h and %p)");
    return c;
  }();
  return *catalogue;
}

const char* logLevelName(LogLevel level) {
  return kLevelNames[static_cast<size_t>(level)];
}

const char* logCategoryName(LogCategory category) {
  return kCategoryNames[static_cast<size_t>(category)];
}

bool logEnabled(LogLevel level, LogCategory category) {
  ensureConfigured();
  return static_cast<int>(level) >=
         state().thresholds[static_cast<size_t>(category)].load(std::memory_order_relaxed);
}

void logMessage(LogLevel level, LogCategory category, const char* file, int line, const char* fmt,
                ...) {
  va_list args;
  va_start(args, fmt);
  std::string message = strVPrintf(fmt, args);
  va_end(args);
  LoggerState& s = state();
  LogSink sink;
  int fd;
  {
    std::lock_guard<std::mutex> lock(s.sinkMu);
    sink = s.sink;
    fd = s.fd;
  }
  if (sink) {
    sink(level, category, file, line, message);
  } else {
    defaultSink(fd, level, category, file, line, message);
  }
}

void setLogSink(LogSink sink) {
  LoggerState& s = state();
  std::lock_guard<std::mutex> lock(s.sinkMu);
  s.sink = std::move(sink);
}

Status configureLogging() {
  ensureConfigured();
  return applyConfiguration();
}

void setLogLevel(LogLevel level) {
  ensureConfigured();
  for (auto& t : state().thresholds) {
    t.store(static_cast<int>(level), std::memory_order_relaxed);
  }
}

void setLogLevel(LogCategory category, LogLevel level) {
  ensureConfigured();
  state().thresholds[static_cast<size_t>(category)].store(static_cast<int>(level),
                                                          std::memory_order_relaxed);
}

void setLogRank(int rank) {
  state().rank.store(rank, std::memory_order_relaxed);
}

}  // namespace bagua
