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

// The two process-lifetime singletons below are leaked on purpose. When this code lives in a
// shared object that is dlclose()d (NCCL unloads its net plugin; the plugin tests load and
// unload it), the static pointers to them vanish with the image and LeakSanitizer would report
// them at exit, from an unloaded module that its suppressions cannot name: the sanitizer build
// marks them as intentional instead.
#if defined(__SANITIZE_ADDRESS__)
#define BAGUA_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(leak_sanitizer)
#define BAGUA_LSAN 1
#endif
#endif
#ifdef BAGUA_LSAN
#include <sanitizer/lsan_interface.h>
#endif

namespace bagua {

namespace {

constexpr std::array<const char*, 6> kLevelNames = {"trace", "debug", "info",
                                                    "warn",  "error", "off"};
constexpr int kMaxCategories = LogCategory::kMaxLogCategories;

std::optional<LogLevel> levelFromName(std::string_view name) {
  for (size_t i = 0; i < kLevelNames.size(); ++i) {
    if (name == kLevelNames[i]) {
      return static_cast<LogLevel>(i);
    }
  }
  return std::nullopt;
}

// "net:debug,bucket:info" as (category name, or empty for all, level) pairs.
using SubsysSpec = std::vector<std::pair<std::string, LogLevel>>;

struct LoggerState {
  // Categories: names[i] is published before count covers i (release/acquire on count).
  std::mutex registryMu;  // serialises registration; a leaf lock
  std::array<const char*, kMaxCategories> names{};
  std::atomic<int> count{0};
  std::array<std::atomic<int>, kMaxCategories> thresholds{};

  std::atomic<bool> configured{false};
  std::once_flag once;
  // What the last configuration asked for, applied to categories registered after it.
  LogLevel global = LogLevel::kWarn;  // guarded by registryMu
  SubsysSpec subsys;                  // guarded by registryMu

  std::mutex sinkMu;
  LogSink sink;            // guarded by sinkMu
  int fd = STDERR_FILENO;  // guarded by sinkMu
  std::atomic<int> rank{-1};
};

template <typename T>
T* intentionallyLeaked(T* p) {
#ifdef BAGUA_LSAN
  __lsan_ignore_object(p);
#endif
  return p;
}

LoggerState& state() {
  // Leaked on purpose: logging must work from destructors of other statics.
  static LoggerState* s = intentionallyLeaked(new LoggerState());
  return *s;
}

std::optional<int> categoryFromName(std::string_view name) {
  LoggerState& s = state();
  int n = s.count.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    if (name == s.names[static_cast<size_t>(i)]) {
      return i;
    }
  }
  return std::nullopt;
}

std::string registeredList() {
  std::string out;
  for (const std::string& n : logCategoryNames()) {
    out += (out.empty() ? "" : ", ") + n;
  }
  return out;
}

Status parseSubsys(std::string_view text, SubsysSpec* out) {
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
    if (cat != "all" && !categoryFromName(cat)) {
      return BAGUA_ERROR(kInvalidArgument, "unknown category '%.*s' (this process has: %s)",
                         static_cast<int>(cat.size()), cat.data(), registeredList().c_str());
    }
    if (out != nullptr) {
      out->emplace_back(cat == "all" ? std::string() : std::string(cat), *level);
    }
  }
  return Status::ok();
}

// The threshold the last configuration gives category `name`. Caller holds registryMu.
LogLevel thresholdFor(const LoggerState& s, std::string_view name) {
  LogLevel level = s.global;
  for (const auto& [cat, lvl] : s.subsys) {
    if (cat.empty() || cat == name) {
      level = lvl;
    }
  }
  return level;
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
  BaseParams& params = baseParams();
  LogLevel global = LogLevel::kWarn;
  SubsysSpec subsys;
  Status status;
  Result<std::string> level = params.logLevel.get();
  if (level.isOk()) {
    global = *levelFromName(*level);
  } else {
    status = level.status();
  }
  Result<std::string> sub = params.logSubsys.get();
  if (sub.isOk()) {
    parseSubsys(*sub, &subsys).ignore();  // validated by the parameter already
  } else if (status.isOk()) {
    status = sub.status();
  }
  {
    std::lock_guard<std::mutex> lock(s.registryMu);
    s.global = global;
    s.subsys = std::move(subsys);
    int n = s.count.load(std::memory_order_acquire);
    for (int i = 0; i < n; ++i) {
      s.thresholds[static_cast<size_t>(i)].store(
          static_cast<int>(thresholdFor(s, s.names[static_cast<size_t>(i)])),
          std::memory_order_relaxed);
    }
  }
  Result<std::string> file = params.logFile.get();
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
      logMessage(LogLevel::kWarn, kLogEnv, __FILE__, __LINE__, "%s", st.toString().c_str());
    }
  });
}

void defaultSink(int fd, LogLevel level, const LogCategory& category, const char* file, int line,
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
                              category.name(), message.c_str(), where.c_str());
  // One write per line keeps lines from different threads whole.
  ssize_t n = ::write(fd, out.data(), out.size());
  (void)n;
}

}  // namespace

BaseParams& baseParams() {
  // Leaked on purpose, like the logger state.
  static BaseParams* params = intentionallyLeaked(new BaseParams());
  return *params;
}

Status validateLogSubsys(const std::string& value) {
  return parseSubsys(value, nullptr);
}

LogCategory::LogCategory(const char* name) {
  LoggerState& s = state();
  std::lock_guard<std::mutex> lock(s.registryMu);
  int n = s.count.load(std::memory_order_relaxed);
  for (int i = 0; i < n; ++i) {
    if (std::strcmp(s.names[static_cast<size_t>(i)], name) == 0) {
      id_ = i;
      return;
    }
  }
  BAGUA_ASSERT(n < kMaxCategories, "more than %d log categories (registering '%s')", kMaxCategories,
               name);
  s.names[static_cast<size_t>(n)] = name;
  s.thresholds[static_cast<size_t>(n)].store(static_cast<int>(thresholdFor(s, name)),
                                             std::memory_order_relaxed);
  s.count.store(n + 1, std::memory_order_release);
  id_ = n;
}

const char* LogCategory::name() const {
  return state().names[static_cast<size_t>(id_)];
}

std::vector<std::string> logCategoryNames() {
  LoggerState& s = state();
  int n = s.count.load(std::memory_order_acquire);
  return std::vector<std::string>(s.names.begin(), s.names.begin() + n);
}

const char* logLevelName(LogLevel level) {
  return kLevelNames[static_cast<size_t>(level)];
}

bool logEnabled(LogLevel level, const LogCategory& category) {
  ensureConfigured();
  return static_cast<int>(level) >=
         state().thresholds[static_cast<size_t>(category.id())].load(std::memory_order_relaxed);
}

void logMessage(LogLevel level, const LogCategory& category, const char* file, int line,
                const char* fmt, ...) {
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

void setLogLevel(const LogCategory& category, LogLevel level) {
  ensureConfigured();
  state().thresholds[static_cast<size_t>(category.id())].store(static_cast<int>(level),
                                                               std::memory_order_relaxed);
}

void setLogRank(int rank) {
  state().rank.store(rank, std::memory_order_relaxed);
}

}  // namespace bagua
