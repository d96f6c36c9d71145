#include "bagua/core/job_key.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>

#include "bagua/base/logging.h"
#include "bagua/core/params.h"

namespace bagua::core {

Result<JobKey> JobKey::fromSecret(std::string_view secret) {
  if (secret.size() < kMinJobKeyChars) {
    return BAGUA_ERROR(kInvalidArgument, "a job key needs at least %zu characters, got %zu",
                       kMinJobKeyChars, secret.size());
  }
  JobKey k;
  k.secret_ = std::string(secret);
  return k;
}

Digest JobKey::derive(std::string_view purpose) const {
  HmacSha256 h(secret_);
  h.update("bagua/");
  h.update(purpose);
  h.update("/v1");
  return h.finish();
}

namespace {

Result<std::string> readKeyFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0 && errno == ELOOP) {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);  // a link to the real file is fine
  }
  if (fd < 0) {
    return BAGUA_ERRNO(errno, strPrintf("BAGUA_JOB_KEY_FILE=%s: cannot open", path.c_str()));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return BAGUA_ERRNO(err, strPrintf("BAGUA_JOB_KEY_FILE=%s: fstat", path.c_str()));
  }
  if (!S_ISREG(st.st_mode) || st.st_size > 4096) {
    ::close(fd);
    return BAGUA_ERROR(kInvalidArgument,
                       "BAGUA_JOB_KEY_FILE=%s is not a regular file of at most 4096 bytes",
                       path.c_str());
  }
  if ((st.st_mode & 077) != 0) {
    ::close(fd);
    return BAGUA_ERROR(kInvalidArgument,
                       "BAGUA_JOB_KEY_FILE=%s may be read by other users (mode %04o): run "
                       "'chmod 600 %s'",
                       path.c_str(), static_cast<unsigned>(st.st_mode & 07777), path.c_str());
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      break;
    }
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  text.resize(got);
  auto space = [](char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; };
  while (!text.empty() && space(text.back())) {
    text.pop_back();
  }
  size_t start = 0;
  while (start < text.size() && space(text[start])) {
    ++start;
  }
  return text.substr(start);
}

Result<JobKey> loadJobKey(bool warnWhenAbsent) {
  BAGUA_ASSIGN_OR_RETURN(std::string secret, coreParams().jobKey.get());
  BAGUA_ASSIGN_OR_RETURN(std::string file, coreParams().jobKeyFile.get());
  if (!secret.empty() && !file.empty()) {
    return BAGUA_ERROR(kInvalidArgument,
                       "both BAGUA_JOB_KEY and BAGUA_JOB_KEY_FILE=%s are set; set one of them",
                       file.c_str());
  }
  if (!file.empty()) {
    BAGUA_ASSIGN_OR_RETURN(secret, readKeyFile(file));
    Result<JobKey> k = JobKey::fromSecret(secret);
    if (!k.isOk()) {
      Status s = k.takeStatus();
      s.withContext(strPrintf("BAGUA_JOB_KEY_FILE=%s", file.c_str()));
      return s;
    }
    return k;
  }
  if (!secret.empty()) {
    Result<JobKey> k = JobKey::fromSecret(secret);
    if (!k.isOk()) {
      // Never quoting the value: a key must not reach a log.
      return BAGUA_ERROR(kInvalidArgument,
                         "BAGUA_JOB_KEY has %zu characters (not shown); a job key needs at least "
                         "%zu (e.g. `openssl rand -hex 32`)",
                         secret.size(), kMinJobKeyChars);
    }
    return k;
  }
  Result<int64_t> rank = coreParams().rank.get();
  if (warnWhenAbsent && rank.isOk() && *rank == 0) {
    BAGUA_LOG_WARN(kLogCore,
                   "no job key (BAGUA_JOB_KEY or BAGUA_JOB_KEY_FILE): the TCP store, the host "
                   "backend's connections and its heartbeats accept any process that reaches "
                   "their ports. baguarun and python -m bagua.distributed.launch set one for a "
                   "single-node job; for several nodes export the same BAGUA_JOB_KEY (e.g. "
                   "$(openssl rand -hex 32)) on every node");
  }
  return JobKey();
}

}  // namespace

Result<JobKey> readJobKeyFromParams() {
  return loadJobKey(false);
}

Result<JobKey> jobKeyFromParams() {
  static std::mutex mu;
  static bool loaded = false;
  static Result<JobKey> key = JobKey();
  std::lock_guard<std::mutex> lock(mu);
  if (!loaded) {
    key = loadJobKey(true);
    loaded = true;
  }
  return key;
}

Result<std::string> generateJobSecret() {
  uint8_t raw[32];
  BAGUA_RETURN_IF_ERROR(randomBytes(raw, sizeof(raw)));
  return toHex(raw, sizeof(raw));
}

}  // namespace bagua::core
