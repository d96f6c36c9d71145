#include "bagua/base/params.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

namespace bagua {

const char* paramTypeName(ParamType type) {
  switch (type) {
  case ParamType::kBool:
    return "bool";
  case ParamType::kInt:
    return "int";
  case ParamType::kDouble:
    return "double";
  case ParamType::kBytes:
    return "bytes";
  case ParamType::kString:
    return "string";
  case ParamType::kEnum:
    return "enum";
  }
  return "?";
}

const char* paramSourceName(ParamSource source) {
  switch (source) {
  case ParamSource::kDefault:
    return "default";
  case ParamSource::kEnvironment:
    return "environment";
  case ParamSource::kApi:
    return "api";
  }
  return "?";
}

std::optional<std::string> processEnv(const std::string& key) {
  const char* v = std::getenv(key.c_str());  // the one getenv of the project
  if (v == nullptr) {
    return std::nullopt;
  }
  return std::string(v);
}

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

std::string quoted(std::string_view s) {
  return "'" + std::string(s) + "'";
}

}  // namespace

Result<bool> parseBool(std::string_view text) {
  std::string t = lower(text);
  if (t == "1" || t == "true" || t == "yes" || t == "on") {
    return true;
  }
  if (t == "0" || t == "false" || t == "no" || t == "off") {
    return false;
  }
  return BAGUA_ERROR(kInvalidArgument, "%s is not a boolean", quoted(text).c_str());
}

Result<int64_t> parseInt(std::string_view text) {
  std::string t(text);
  if (t.empty() || std::isspace(static_cast<unsigned char>(t.front())) ||
      std::isspace(static_cast<unsigned char>(t.back()))) {
    return BAGUA_ERROR(kInvalidArgument, "%s is not an integer", quoted(text).c_str());
  }
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(t.c_str(), &end, 0);
  if (end != t.c_str() + t.size()) {
    return BAGUA_ERROR(kInvalidArgument, "%s is not an integer", quoted(text).c_str());
  }
  if (errno == ERANGE) {
    return BAGUA_ERROR(kInvalidArgument, "%s does not fit in 64 bits", quoted(text).c_str());
  }
  // strtoll reads "010" as octal; we refuse leading zeros to avoid surprises.
  size_t digits = (t[0] == '-' || t[0] == '+') ? 1 : 0;
  if (t.size() > digits + 1 && t[digits] == '0' && t[digits + 1] != 'x' && t[digits + 1] != 'X') {
    return BAGUA_ERROR(kInvalidArgument, "%s has a leading zero (octal is not accepted)",
                       quoted(text).c_str());
  }
  return static_cast<int64_t>(v);
}

Result<double> parseDouble(std::string_view text) {
  std::string t(text);
  if (t.empty() || std::isspace(static_cast<unsigned char>(t.front())) ||
      std::isspace(static_cast<unsigned char>(t.back()))) {
    return BAGUA_ERROR(kInvalidArgument, "%s is not a number", quoted(text).c_str());
  }
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size() || errno == ERANGE || !std::isfinite(v)) {
    return BAGUA_ERROR(kInvalidArgument, "%s is not a finite number", quoted(text).c_str());
  }
  return v;
}

Result<uint64_t> parseBytes(std::string_view text) {
  std::string t = lower(text);
  size_t i = 0;
  while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) {
    ++i;
  }
  if (i == 0) {
    return BAGUA_ERROR(kInvalidArgument,
                       "%s is not a byte size (a number with an optional K/M/G/T suffix)",
                       quoted(text).c_str());
  }
  std::string num = t.substr(0, i);
  std::string suffix = t.substr(i);
  int shift = 0;
  if (suffix.empty() || suffix == "b") {
    shift = 0;
  } else if (suffix == "k" || suffix == "kb" || suffix == "kib") {
    shift = 10;
  } else if (suffix == "m" || suffix == "mb" || suffix == "mib") {
    shift = 20;
  } else if (suffix == "g" || suffix == "gb" || suffix == "gib") {
    shift = 30;
  } else if (suffix == "t" || suffix == "tb" || suffix == "tib") {
    shift = 40;
  } else {
    return BAGUA_ERROR(kInvalidArgument, "%s has an unknown size suffix %s (use K, M, G or T)",
                       quoted(text).c_str(), quoted(suffix).c_str());
  }
  errno = 0;
  unsigned long long v = std::strtoull(num.c_str(), nullptr, 10);
  if (errno == ERANGE || (shift > 0 && v > (std::numeric_limits<uint64_t>::max() >> shift))) {
    return BAGUA_ERROR(kInvalidArgument, "%s is too large", quoted(text).c_str());
  }
  return static_cast<uint64_t>(v) << shift;
}

std::string formatBytes(uint64_t bytes) {
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  for (int u = 3; u >= 0; --u) {
    uint64_t unit = uint64_t{1} << (10 * (u + 1));
    if (bytes >= unit && bytes % unit == 0) {
      return strPrintf("%llu %s", static_cast<unsigned long long>(bytes / unit), kUnits[u]);
    }
  }
  return strPrintf("%llu", static_cast<unsigned long long>(bytes));
}

Result<std::string> ParamBase::valueString() {
  Status s = load();
  if (!s.isOk()) {
    return s;
  }
  std::lock_guard<std::mutex> lock(mu_);
  return currentString();
}

std::optional<std::string> ParamBase::lookupEnv() const {
  return catalogue_->lookupEnv(key_);
}

Status ParamBase::badValue(const std::string& value, const Status& why) const {
  return Status(StatusCode::kInvalidArgument,
                strPrintf("%s='%s' is invalid (%s); accepted: %s", key_.c_str(), value.c_str(),
                          why.message().c_str(), acceptedString().c_str()));
}

ParamBase::ParamBase(ParamCatalogue& catalogue, std::string key, ParamType type,
                     std::string description)
    : catalogue_(&catalogue),
      key_(std::move(key)),
      type_(type),
      description_(std::move(description)) {
  catalogue.add(this);
}

ParamCatalogue::ParamCatalogue(std::string library, std::string description)
    : library_(std::move(library)), description_(std::move(description)) {}

void ParamCatalogue::add(ParamBase* param) {
  BAGUA_ASSERT(find(param->key()) == nullptr, "parameter %s declared twice in catalogue %s",
               param->key().c_str(), library_.c_str());
  params_.push_back(param);
}

namespace {

template <typename T>
Status checkBounds(const T& v, const Bounds<T>& b) {
  if (v < b.min || v > b.max) {
    return BAGUA_ERROR(kInvalidArgument, "out of range");
  }
  return Status::ok();
}

}  // namespace

BoolParam::BoolParam(ParamCatalogue& catalogue, std::string key, bool def, std::string description)
    : Param<bool>(catalogue, std::move(key), ParamType::kBool, def, std::move(description),
                  "a boolean: 1/0, true/false, yes/no, on/off", parseBool, nullptr,
                  [](const bool& v) { return std::string(v ? "true" : "false"); }) {}

IntParam::IntParam(ParamCatalogue& catalogue, std::string key, int64_t def, Bounds<int64_t> bounds,
                   std::string description)
    : Param<int64_t>(
          catalogue, std::move(key), ParamType::kInt, def, std::move(description),
          strPrintf("an integer in [%lld, %lld]", static_cast<long long>(bounds.min),
                    static_cast<long long>(bounds.max)),
          parseInt, [bounds](const int64_t& v) { return checkBounds(v, bounds); },
          [](const int64_t& v) { return std::to_string(v); }) {}

DoubleParam::DoubleParam(ParamCatalogue& catalogue, std::string key, double def,
                         Bounds<double> bounds, std::string description)
    : Param<double>(
          catalogue, std::move(key), ParamType::kDouble, def, std::move(description),
          strPrintf("a number in [%g, %g]", bounds.min, bounds.max), parseDouble,
          [bounds](const double& v) { return checkBounds(v, bounds); },
          [](const double& v) { return strPrintf("%g", v); }) {}

BytesParam::BytesParam(ParamCatalogue& catalogue, std::string key, uint64_t def,
                       Bounds<uint64_t> bounds, std::string description)
    : Param<uint64_t>(
          catalogue, std::move(key), ParamType::kBytes, def, std::move(description),
          "a byte size in [" + formatBytes(bounds.min) + ", " + formatBytes(bounds.max) +
              "], optionally with a K/M/G/T suffix",
          parseBytes, [bounds](const uint64_t& v) { return checkBounds(v, bounds); },
          [](const uint64_t& v) { return formatBytes(v); }) {}

StringParam::StringParam(ParamCatalogue& catalogue, std::string key, std::string def,
                         std::string description, std::string accepted, Validator validator)
    : Param<std::string>(
          catalogue, std::move(key), ParamType::kString, std::move(def), std::move(description),
          std::move(accepted),
          [](std::string_view t) -> Result<std::string> { return std::string(t); },
          std::move(validator), [](const std::string& v) { return v; }) {}

namespace {

std::string enumAccepted(const std::vector<EnumChoice>& choices) {
  std::string accepted = "one of";
  for (size_t i = 0; i < choices.size(); ++i) {
    accepted += (i == 0 ? " " : ", ") + choices[i].name;
    if (!choices[i].description.empty()) {
      accepted += " (" + choices[i].description + ")";
    }
  }
  return accepted;
}

}  // namespace

EnumParam::EnumParam(ParamCatalogue& catalogue, std::string key, std::string def,
                     std::vector<EnumChoice> choices, std::string description)
    : Param<std::string>(
          catalogue, std::move(key), ParamType::kEnum, std::move(def), std::move(description),
          enumAccepted(choices),
          [choices](std::string_view t) -> Result<std::string> {
            std::string l = lower(t);
            for (const EnumChoice& c : choices) {
              if (lower(c.name) == l) {
                return c.name;
              }
            }
            return BAGUA_ERROR(kInvalidArgument, "unknown name");
          },
          [choices](const std::string& v) -> Status {
            for (const EnumChoice& c : choices) {
              if (c.name == v) {
                return Status::ok();
              }
            }
            return BAGUA_ERROR(kInvalidArgument, "unknown name");
          },
          [](const std::string& v) { return v; }) {}

Status ParamCatalogue::loadAll() {
  for (ParamBase* p : params_) {
    BAGUA_RETURN_IF_ERROR(p->load());
  }
  return Status::ok();
}

ParamBase* ParamCatalogue::find(std::string_view key) const {
  for (ParamBase* p : params_) {
    if (p->key() == key) {
      return p;
    }
  }
  return nullptr;
}

std::optional<std::string> ParamCatalogue::lookupEnv(const std::string& key) const {
  return lookup_ ? lookup_(key) : processEnv(key);
}

void ParamCatalogue::setEnvLookupForTesting(EnvLookup lookup) {
  lookup_ = std::move(lookup);
  resetForTesting();
}

void ParamCatalogue::resetForTesting() {
  for (ParamBase* p : params_) {
    p->resetForTesting();
  }
}

ScopedEnvForTesting::ScopedEnvForTesting(ParamCatalogue& catalogue,
                                         std::vector<std::pair<std::string, std::string>> vars)
    : catalogue_(catalogue) {
  catalogue_.setEnvLookupForTesting(
      [vars = std::move(vars)](const std::string& key) -> std::optional<std::string> {
        for (const auto& [k, v] : vars) {
          if (k == key) {
            return v;
          }
        }
        return std::nullopt;
      });
}

ScopedEnvForTesting::~ScopedEnvForTesting() {
  catalogue_.setEnvLookupForTesting(nullptr);
}

}  // namespace bagua
