// bagua-params: every parameter of every bagua library with its current value and its source.
//
//   bagua-params            table of all parameters
//   bagua-params --json     the same as JSON
//   bagua-params --check    exit 1 (listing each) if any environment value is invalid
//   bagua-params --markdown [LIBRARY]
//                           the README tables: key, type, default, accepted values, description
//                           (defaults, never the environment's values, so the output depends on
//                           the build only); `./bagua docs` writes them into the READMEs
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "bagua/algorithms/params.h"
#include "bagua/autotune/params.h"
#include "bagua/base/logging.h"
#include "bagua/base/params.h"
#include "bagua/cli_support/cli.h"
#include "bagua/core/params.h"
#include "bagua/dataset_cache/params.h"
#include "bagua/loader/params.h"
#include "bagua/net/params.h"
#include "bagua/optimizer/params.h"
#include "bagua/python/params.h"
#include "baguarun_params.h"  // tools/baguarun
#include "tuner.h"            // net_plugin private: the tuner's catalogue

namespace {

std::vector<bagua::ParamCatalogue*> allCatalogues() {
  // One line per library catalogue.
  return {&bagua::baseParams(),
          &bagua::core::coreParams(),
          &bagua::cache::cacheParams(),
          &bagua::loader::loaderParams(),
          &bagua::net::netParams(),
          &bagua::net::tuner::tunerParams(),
          &bagua::autotune::autotuneParams(),
          &bagua::optim::optimizerParams(),
          &bagua::algo::algorithmsParams(),
          &bagua::py::pythonParams(),
          &bagua::baguarun::baguarunParams()};
}

// `s` with a backslash before each character of `special` and each control character replaced
// by `control(c)`: Markdown table cells.
template <typename Control>
std::string escape(const std::string& s, std::string_view special, Control control) {
  std::string out;
  for (char c : s) {
    if (special.find(c) != std::string_view::npos) {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += control(c);
    } else {
      out += c;
    }
  }
  return out;
}

// A table cell: one line; '|' escaped so it does not end the cell, '<' so that "<if>" in a
// description is text, not an HTML tag.
std::string markdownCell(const std::string& s) {
  return escape(s, "|<", [](char) { return std::string(" "); });
}

// One catalogue as a Markdown table (the block `./bagua docs` keeps in each README).
void printMarkdown(const bagua::ParamCatalogue& c) {
  std::printf("| key | type | default | accepted | description |\n");
  std::printf("| --- | --- | --- | --- | --- |\n");
  for (const auto& p : c.params()) {
    const std::string def = p->defaultString();
    std::printf("| `%s` | %s | %s | %s | %s |\n", p->key().c_str(), bagua::paramTypeName(p->type()),
                def.empty() ? "(empty)" : ("`" + markdownCell(def) + "`").c_str(),
                markdownCell(p->acceptedString()).c_str(), markdownCell(p->description()).c_str());
  }
}

std::string libraryNames() {
  std::string out;
  for (bagua::ParamCatalogue* c : allCatalogues()) {
    out += (out.empty() ? "" : ", ") + c->library();
  }
  return out;
}

// --markdown [LIBRARY]: that library's table, or every library's under a heading of its own.
int markdown(const char* library) {
  bool found = false;
  for (bagua::ParamCatalogue* c : allCatalogues()) {
    if (library != nullptr) {
      if (c->library() == library) {
        printMarkdown(*c);
        found = true;
      }
      continue;
    }
    std::printf("%s### %s: %s\n\n", found ? "\n" : "", c->library().c_str(),
                c->description().c_str());
    printMarkdown(*c);
    found = true;
  }
  if (!found) {
    return bagua::cli::usageError(
        "bagua-params", bagua::strPrintf("--markdown: no library '%s' (libraries: %s)", library,
                                         libraryNames().c_str()));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  bool check = false;
  std::optional<std::string> markdownLibrary;
  CLI::App app{
      "Lists every bagua parameter: environment key, type, current value, where the "
      "value came from (default, environment, api), default, accepted values and "
      "description.",
      "bagua-params"};
  bagua::cli::configure(app);
  app.add_flag("--json", json, "machine-readable output");
  app.add_flag("--check", check, "exit with status 1 if any environment value is invalid");
  CLI::Option* markdownOpt =
      app.add_option("--markdown", markdownLibrary,
                     "the README tables (key, type, default, accepted, description) of one "
                     "library or of all; libraries: " +
                         libraryNames())
          ->expected(0, 1)
          ->type_name("[LIBRARY]");
  markdownOpt->excludes(app.get_option("--json"))->excludes(app.get_option("--check"));
  if (std::optional<int> rc = bagua::cli::parse(app, argc, argv)) {
    return *rc;
  }
  const bool markdownMode = markdownOpt->count() > 0;
  const char* library =
      markdownLibrary && !markdownLibrary->empty() ? markdownLibrary->c_str() : nullptr;
  if (markdownMode) {
    return markdown(library);
  }
  int invalid = 0;
  // ordered_json: the fields in the order the table prints them.
  nlohmann::ordered_json entries = nlohmann::ordered_json::array();
  for (bagua::ParamCatalogue* c : allCatalogues()) {
    if (!json) {
      std::printf("== %s: %s\n", c->library().c_str(), c->description().c_str());
    }
    for (const auto& p : c->params()) {
      bagua::Result<std::string> v = p->valueString();
      std::string value = v.isOk() ? *v : "INVALID";
      std::string source = v.isOk() ? bagua::paramSourceName(p->source()) : "environment";
      if (!v.isOk()) {
        ++invalid;
      }
      if (json) {
        entries.push_back({{"library", c->library()},
                           {"key", p->key()},
                           {"type", bagua::paramTypeName(p->type())},
                           {"value", value},
                           {"source", source},
                           {"default", p->defaultString()},
                           {"accepted", p->acceptedString()},
                           {"valid", v.isOk()},
                           {"description", p->description()}});
      } else {
        std::printf("  %-32s %-7s = %-20s [%s]\n", p->key().c_str(),
                    bagua::paramTypeName(p->type()), value.c_str(), source.c_str());
        std::printf("      default %s; accepted: %s\n", p->defaultString().c_str(),
                    p->acceptedString().c_str());
        std::printf("      %s\n", p->description().c_str());
        if (!v.isOk()) {
          std::printf("      ERROR: %s\n", v.status().message().c_str());
        }
      }
    }
  }
  if (json) {
    std::printf("%s\n", entries.dump(2).c_str());
  }
  if (invalid > 0) {
    std::fprintf(stderr, "bagua-params: %d invalid value(s) in the environment\n", invalid);
  }
  return check && invalid > 0 ? 1 : 0;
}
