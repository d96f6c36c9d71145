// A secret knob (a key) in a library's catalogue (bagua/base/params.h): read like a
// StringParam, but its text is never shown. Dumps (`bagua-params`) print "(set, N characters)"
// or "(not set)"; the default is always empty. It takes any text: the library that uses it
// checks the value itself and words its own error without quoting it (the catalogue's errors
// quote a bad value).
#pragma once

#include <string>
#include <string_view>

#include "bagua/base/params.h"

namespace bagua {

class SecretParam final : public Param<std::string> {
 public:
  SecretParam(ParamCatalogue& catalogue, std::string key, std::string description,
              std::string accepted)
      : Param<std::string>(
            catalogue, std::move(key), ParamType::kString, std::string(), std::move(description),
            std::move(accepted),
            [](std::string_view t) -> Result<std::string> { return std::string(t); }, nullptr,
            [](const std::string& v) {
              return v.empty() ? std::string("(not set)")
                               : strPrintf("(set, %zu characters)", v.size());
            }) {}
};

}  // namespace bagua
