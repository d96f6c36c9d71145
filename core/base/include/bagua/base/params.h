// The typed parameter catalogue: every knob of a library declared once, with its env key, type,
// default, validator and description (NCCL's DEFINE_NCCL_PARAM, aws-ofi-nccl's param table).
//
// Rules (core/base/README.md, "Configuration"):
// - Strict parsing: the whole string must parse; a bad value is an error naming the key, the
//   value and what is accepted. Never a silent default.
// - Precedence: API override (setOverride) > environment > default. The source is recorded.
// - Frozen: a parameter is read once, on first get(); later environment changes are ignored and
//   setOverride() after the first read fails with FailedPrecondition.
// - This file's .cc is the only place in bagua that reads the process environment.
//
// Thread safety: get() and the accessors may be called from any thread. setOverride(),
// setEnvLookupForTesting() and resetForTesting() must not race with get() on the same catalogue.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bagua/base/status.h"

namespace bagua {

enum class ParamType { kBool, kInt, kDouble, kBytes, kString, kEnum };
enum class ParamSource { kDefault, kEnvironment, kApi };

const char* paramTypeName(ParamType type);
const char* paramSourceName(ParamSource source);

// Looks up an environment key; nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string& key)>;

// The process environment (the only getenv in bagua).
std::optional<std::string> processEnv(const std::string& key);

// Strict parsers, exposed for tests and for tools that parse the same syntax.
// Bool: 1/0/true/false/yes/no/on/off, case-insensitive.
Result<bool> parseBool(std::string_view text);
// Int: optional sign, decimal digits (or 0x hex), nothing else.
Result<int64_t> parseInt(std::string_view text);
// Double: a finite floating-point number.
Result<double> parseDouble(std::string_view text);
// Bytes: a non-negative integer with an optional suffix K, M, G, T (powers of 1024), also
// written KiB/MiB/GiB/TiB or KB/MB/GB/TB (also powers of 1024), case-insensitive.
Result<uint64_t> parseBytes(std::string_view text);
// "1048576" -> "1 MiB" where exact, else the plain number.
std::string formatBytes(uint64_t bytes);

struct EnumChoice {
  std::string name;
  std::string description;
};

class ParamCatalogue;

class ParamBase {
 public:
  ParamBase(const ParamBase&) = delete;
  ParamBase& operator=(const ParamBase&) = delete;
  virtual ~ParamBase() = default;

  const std::string& key() const { return key_; }
  const std::string& description() const { return description_; }
  ParamType type() const { return type_; }
  const ParamCatalogue& catalogue() const { return *catalogue_; }

  // Reads and validates the value if not done yet. Error names the key, value and accepted set.
  virtual Status load() = 0;
  // The current value as text (loads it first); on a bad value, the error.
  Result<std::string> valueString();
  // Where the value came from (meaningful after a successful load()).
  ParamSource source() const { return source_.load(std::memory_order_acquire); }
  virtual std::string defaultString() const = 0;
  // What the parser accepts, for messages and the dump: "an integer in [1, 64]".
  virtual std::string acceptedString() const = 0;
  // Forgets the loaded value and any override (tests only).
  virtual void resetForTesting() = 0;

 protected:
  ParamBase(ParamCatalogue* catalogue, std::string key, ParamType type, std::string description)
      : catalogue_(catalogue),
        key_(std::move(key)),
        type_(type),
        description_(std::move(description)) {}

  std::optional<std::string> lookupEnv() const;
  Status badValue(const std::string& value, const Status& why) const;
  virtual std::string currentString() const = 0;

  ParamCatalogue* catalogue_;
  std::string key_;
  ParamType type_;
  std::string description_;
  std::atomic<ParamSource> source_{ParamSource::kDefault};
  std::atomic<bool> loaded_{false};
  std::mutex mu_;
};

template <typename T>
class Param final : public ParamBase {
 public:
  // Parses text into T (syntax only).
  using Parser = std::function<Result<T>(std::string_view)>;
  // Checks a parsed value (range, one-of); returns InvalidArgument with a reason if rejected.
  using Validator = std::function<Status(const T&)>;
  using Formatter = std::function<std::string(const T&)>;

  Param(ParamCatalogue* catalogue, std::string key, ParamType type, T defaultValue,
        std::string description, std::string accepted, Parser parser, Validator validator,
        Formatter formatter)
      : ParamBase(catalogue, std::move(key), type, std::move(description)),
        default_(std::move(defaultValue)),
        value_(default_),
        accepted_(std::move(accepted)),
        parser_(std::move(parser)),
        validator_(std::move(validator)),
        formatter_(std::move(formatter)) {}

  // The value (loading it on first call). A bad environment value is returned as an error on
  // every call, so every user of the knob sees it.
  Result<T> get() {
    if (!loaded_.load(std::memory_order_acquire)) {
      Status s = load();
      if (!s.isOk()) {
        return s;
      }
    }
    return value_;
  }

  // The value, or the default when the environment holds a bad value. For callers that already
  // validated the catalogue with ParamCatalogue::loadAll() at init.
  T value() {
    Result<T> r = get();
    return r.isOk() ? *r : default_;
  }

  const T& defaultValue() const { return default_; }

  // API option: beats the environment. Fails after the first read (values are frozen) or when
  // the validator rejects the value.
  Status setOverride(T v) {
    std::lock_guard<std::mutex> lock(mu_);
    if (loaded_.load(std::memory_order_acquire)) {
      return BAGUA_ERROR(kFailedPrecondition,
                         "%s was already read (value %s); set it before first use", key_.c_str(),
                         formatter_(value_).c_str());
    }
    if (validator_) {
      Status s = validator_(v);
      if (!s.isOk()) {
        return badValue(formatter_(v), s);
      }
    }
    value_ = std::move(v);
    source_.store(ParamSource::kApi, std::memory_order_release);
    loaded_.store(true, std::memory_order_release);
    return Status::ok();
  }

  Status load() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (loaded_.load(std::memory_order_acquire)) {
      return Status::ok();
    }
    std::optional<std::string> env = lookupEnv();
    if (!env.has_value()) {
      value_ = default_;
      source_.store(ParamSource::kDefault, std::memory_order_release);
      loaded_.store(true, std::memory_order_release);
      return Status::ok();
    }
    Result<T> parsed = parser_(*env);
    if (!parsed.isOk()) {
      return badValue(*env, parsed.status());
    }
    if (validator_) {
      Status s = validator_(*parsed);
      if (!s.isOk()) {
        return badValue(*env, s);
      }
    }
    value_ = std::move(*parsed);
    source_.store(ParamSource::kEnvironment, std::memory_order_release);
    loaded_.store(true, std::memory_order_release);
    return Status::ok();
  }

  std::string defaultString() const override { return formatter_(default_); }
  std::string acceptedString() const override { return accepted_; }
  void resetForTesting() override {
    std::lock_guard<std::mutex> lock(mu_);
    value_ = default_;
    source_.store(ParamSource::kDefault, std::memory_order_release);
    loaded_.store(false, std::memory_order_release);
  }

 protected:
  std::string currentString() const override { return formatter_(value_); }

 private:
  T default_;
  T value_;
  std::string accepted_;
  Parser parser_;
  Validator validator_;
  Formatter formatter_;
};

// One per library. Parameters live as long as the catalogue; references returned by add*() are
// stable.
class ParamCatalogue {
 public:
  explicit ParamCatalogue(std::string library, std::string description = {});
  ParamCatalogue(const ParamCatalogue&) = delete;
  ParamCatalogue& operator=(const ParamCatalogue&) = delete;

  const std::string& library() const { return library_; }
  const std::string& description() const { return description_; }

  Param<bool>& addBool(std::string key, bool def, std::string description);
  Param<int64_t>& addInt(std::string key, int64_t def, int64_t min, int64_t max,
                         std::string description);
  Param<double>& addDouble(std::string key, double def, double min, double max,
                           std::string description);
  Param<uint64_t>& addBytes(std::string key, uint64_t def, uint64_t min, uint64_t max,
                            std::string description);
  // A free-form string; `validator` (optional) checks its syntax; `accepted` describes it.
  Param<std::string>& addString(std::string key, std::string def, std::string description,
                                std::string accepted = "any string",
                                Param<std::string>::Validator validator = nullptr);
  // One of `choices` (case-insensitive; stored in the choice's spelling).
  Param<std::string>& addEnum(std::string key, std::string def, std::vector<EnumChoice> choices,
                              std::string description);

  // Loads every parameter; the first bad one fails with its key, value and accepted values.
  Status loadAll();

  const std::vector<std::unique_ptr<ParamBase>>& params() const { return params_; }
  ParamBase* find(std::string_view key) const;

  std::optional<std::string> lookupEnv(const std::string& key) const;
  // Replaces the environment for this catalogue (tests); pass nullptr to restore the process
  // environment. Also resets every parameter.
  void setEnvLookupForTesting(EnvLookup lookup);
  void resetForTesting();

 private:
  template <typename T>
  Param<T>& add(std::unique_ptr<Param<T>> param);

  std::string library_;
  std::string description_;
  std::vector<std::unique_ptr<ParamBase>> params_;
  EnvLookup lookup_;
};

// Scoped test helper: gives a catalogue a fake environment and restores the real one after.
class ScopedEnvForTesting {
 public:
  ScopedEnvForTesting(ParamCatalogue& catalogue,
                      std::vector<std::pair<std::string, std::string>> vars);
  ~ScopedEnvForTesting();
  ScopedEnvForTesting(const ScopedEnvForTesting&) = delete;
  ScopedEnvForTesting& operator=(const ScopedEnvForTesting&) = delete;

 private:
  ParamCatalogue& catalogue_;
};

// The base library's own parameters (logging).
ParamCatalogue& baseParams();

}  // namespace bagua
