// The job's secret key (core/README.md, "Security"): what the TCP store, the host backend's
// connection set-up and its heartbeats authenticate with, so that a process that can reach the
// job's ports but does not hold the key can neither read nor write the store, join a
// communicator, nor change what a rank believes about its peers.
//
// The secret comes from BAGUA_JOB_KEY or from the file named by BAGUA_JOB_KEY_FILE (never both).
// Each use derives its own key from it (derive("store"), derive("mesh"), ...), so a tag made for
// one message kind is never valid for another. Without a secret every derived key is a fixed,
// public value: the same code runs, and nothing is authenticated (rank 0 logs one warning
// naming the variable).
//
// Thread safety: a JobKey is an immutable value; jobKeyFromParams() may be called from any
// thread (it reads the frozen catalogue and the file once).
#pragma once

#include <string>
#include <string_view>

#include "bagua/base/crypto.h"
#include "bagua/base/status.h"

namespace bagua::core {

inline constexpr size_t kMinJobKeyChars = 32;

class JobKey {
 public:
  JobKey() = default;  // no secret: unauthenticated
  // InvalidArgument when shorter than kMinJobKeyChars.
  static Result<JobKey> fromSecret(std::string_view secret);

  bool present() const { return !secret_.empty(); }
  // The key for one purpose: HMAC-SHA256 of "bagua/<purpose>/v1" under the secret.
  Digest derive(std::string_view purpose) const;
  bool operator==(const JobKey& other) const { return secret_ == other.secret_; }

 private:
  std::string secret_;
};

// The process's key from BAGUA_JOB_KEY / BAGUA_JOB_KEY_FILE, read once (later calls return the
// same value). Errors name the variable: both set, a key shorter than 32 characters, a key file
// that cannot be read or that other users may read. With neither set: JobKey() and, on rank 0
// (RANK), one warning per process.
Result<JobKey> jobKeyFromParams();

// The same, read now and not remembered, and without the warning (tests of the variables, and
// users of the key other than the control plane: the cache's value tags).
Result<JobKey> readJobKeyFromParams();

// A fresh random secret for a launcher to hand to its workers: 64 hex digits (32 bytes of the
// kernel's random generator).
Result<std::string> generateJobSecret();

}  // namespace bagua::core
