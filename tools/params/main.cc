// bagua-params: every parameter of every bagua library with its current value and its source.
//
//   bagua-params            table of all parameters
//   bagua-params --json     the same as JSON
//   bagua-params --check    exit 1 (listing each) if any environment value is invalid
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bagua/autotune/params.h"
#include "bagua/base/logging.h"
#include "bagua/base/params.h"
#include "bagua/core/params.h"
#include "bagua/dataset_cache/params.h"
#include "bagua/loader/params.h"
#include "bagua/net/params.h"
#include "bagua/optimizer/params.h"
#include "tuner.h"  // net_plugin private: the tuner's catalogue

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
          &bagua::optim::optimizerParams()};
}

std::string jsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += bagua::strPrintf("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out;
}

void usage() {
  std::printf(
      "usage: bagua-params [--json] [--check]\n"
      "Lists every bagua parameter: environment key, type, current value, where the value\n"
      "came from (default, environment, api), default, accepted values and description.\n"
      "  --json   machine-readable output\n"
      "  --check  exit with status 1 if any environment value is invalid\n");
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  bool check = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "--check") == 0) {
      check = true;
    } else if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      usage();
      return 0;
    } else {
      std::fprintf(stderr, "bagua-params: unknown argument '%s'\n", argv[i]);
      usage();
      return 2;
    }
  }
  int invalid = 0;
  bool first = true;
  if (json) {
    std::printf("[\n");
  }
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
        std::printf(
            "%s  {\"library\": \"%s\", \"key\": \"%s\", \"type\": \"%s\", \"value\": \"%s\", "
            "\"source\": \"%s\", \"default\": \"%s\", \"accepted\": \"%s\", \"valid\": %s, "
            "\"description\": \"%s\"}",
            first ? "" : ",\n", jsonEscape(c->library()).c_str(), p->key().c_str(),
            bagua::paramTypeName(p->type()), jsonEscape(value).c_str(), source.c_str(),
            jsonEscape(p->defaultString()).c_str(), jsonEscape(p->acceptedString()).c_str(),
            v.isOk() ? "true" : "false", jsonEscape(p->description()).c_str());
        first = false;
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
    std::printf("\n]\n");
  }
  if (invalid > 0) {
    std::fprintf(stderr, "bagua-params: %d invalid value(s) in the environment\n", invalid);
  }
  return check && invalid > 0 ? 1 : 0;
}
