// The typed parameter catalogue: every knob of a library declared once, with its env key, type,
// default, validator and description (NCCL's DEFINE_NCCL_PARAM, aws-ofi-nccl's param table).
//
// Rules (base/README.md, "Configuration"):
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

// One knob. Constructed as a member of its library's catalogue struct (see ParamCatalogue), which
// registers it; never copied or moved.
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
  // Registers this parameter with `catalogue` (which must outlive it; a member of the catalogue
  // struct does). A key declared twice in one catalogue is a programming error (asserts).
  ParamBase(ParamCatalogue& catalogue, std::string key, ParamType type, std::string description);

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

// A typed knob: the value is read from the environment on the first get() and then frozen. Use
// the concrete kinds below (BoolParam, IntParam, ...), which fix the parser, validator and
// formatter of each type.
template <typename T>
class Param : public ParamBase {
 public:
  // Parses text into T (syntax only).
  using Parser = std::function<Result<T>(std::string_view)>;
  // Checks a parsed value (range, one-of); returns InvalidArgument with a reason if rejected.
  using Validator = std::function<Status(const T&)>;
  using Formatter = std::function<std::string(const T&)>;

  // The value (loading it on first call). A bad environment value is returned as an error on
  // every call, so every user of the knob sees it; there is no fallback to the default.
  Result<T> get() {
    if (!loaded_.load(std::memory_order_acquire)) {
      Status s = load();
      if (!s.isOk()) {
        return s;
      }
    }
    return value_;
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
  Param(ParamCatalogue& catalogue, std::string key, ParamType type, T defaultValue,
        std::string description, std::string accepted, Parser parser, Validator validator,
        Formatter formatter)
      : ParamBase(catalogue, std::move(key), type, std::move(description)),
        default_(std::move(defaultValue)),
        value_(default_),
        accepted_(std::move(accepted)),
        parser_(std::move(parser)),
        validator_(std::move(validator)),
        formatter_(std::move(formatter)) {}

  std::string currentString() const override { return formatter_(value_); }

 private:
  T default_;
  T value_;
  std::string accepted_;
  Parser parser_;
  Validator validator_;
  Formatter formatter_;
};

// Inclusive bounds of a numeric knob.
template <typename T>
struct Bounds {
  T min;
  T max;
};

// The kinds of knob. Each constructor is the knob's whole declaration:
//   (catalogue, env key, default, [bounds | choices | accepted + validator], description).

// 1/0, true/false, yes/no, on/off (case-insensitive).
class BoolParam final : public Param<bool> {
 public:
  BoolParam(ParamCatalogue& catalogue, std::string key, bool def, std::string description);
};

// A decimal (or 0x hex) integer in [min, max]; no octal, no trailing junk.
class IntParam final : public Param<int64_t> {
 public:
  IntParam(ParamCatalogue& catalogue, std::string key, int64_t def, Bounds<int64_t> bounds,
           std::string description);
};

// A finite number in [min, max].
class DoubleParam final : public Param<double> {
 public:
  DoubleParam(ParamCatalogue& catalogue, std::string key, double def, Bounds<double> bounds,
              std::string description);
};

// A byte size in [min, max] with an optional K/M/G/T suffix (powers of 1024).
class BytesParam final : public Param<uint64_t> {
 public:
  BytesParam(ParamCatalogue& catalogue, std::string key, uint64_t def, Bounds<uint64_t> bounds,
             std::string description);
};

// Free-form text; `validator` (optional) checks its syntax and `accepted` says what it takes.
class StringParam final : public Param<std::string> {
 public:
  StringParam(ParamCatalogue& catalogue, std::string key, std::string def, std::string description,
              std::string accepted = "any string", Validator validator = nullptr);
};

// One of `choices` (case-insensitive; stored in the choice's spelling).
class EnumParam final : public Param<std::string> {
 public:
  EnumParam(ParamCatalogue& catalogue, std::string key, std::string def,
            std::vector<EnumChoice> choices, std::string description);
};

// A library's catalogue: the one idiom for declaring knobs in bagua. A library derives a struct
// whose members are its knobs, each declared once with everything about it:
//
//   struct CoreParams : ParamCatalogue {
//     CoreParams() : ParamCatalogue("core", "process groups, rendezvous, ...") {}
//     IntParam masterPort{*this, "MASTER_PORT", 29500, {1, 65535}, "port of the TCP store"};
//   };
//   CoreParams& coreParams();  // a function-local static; users read coreParams().masterPort.get()
//
// Members register in declaration order (the order of the dump). A catalogue is neither copied
// nor moved: its knobs point at it.
class ParamCatalogue {
 public:
  ParamCatalogue(std::string library, std::string description);
  ParamCatalogue(const ParamCatalogue&) = delete;
  ParamCatalogue& operator=(const ParamCatalogue&) = delete;
  virtual ~ParamCatalogue() = default;

  const std::string& library() const { return library_; }
  const std::string& description() const { return description_; }

  // Loads every parameter; the first bad one fails with its key, value and accepted values.
  Status loadAll();

  // The knobs in declaration order (for dumps and tools; code reads its knobs as members).
  const std::vector<ParamBase*>& params() const { return params_; }
  ParamBase* find(std::string_view key) const;

  std::optional<std::string> lookupEnv(const std::string& key) const;
  // Replaces the environment for this catalogue (tests); pass nullptr to restore the process
  // environment. Also resets every parameter.
  void setEnvLookupForTesting(EnvLookup lookup);
  void resetForTesting();

 private:
  friend class ParamBase;
  void add(ParamBase* param);

  std::string library_;
  std::string description_;
  std::vector<ParamBase*> params_;
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

}  // namespace bagua
