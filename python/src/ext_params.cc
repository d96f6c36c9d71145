// Bagua-Net's settings as the plugin reads them, for `python -m bagua.net --check`: the plugin's
// own catalogues (bagua/net/params.h and the tuner's) parse and validate each value with their
// strict parsers, so the check and the plugin cannot disagree on what is accepted.
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bagua/base/params.h"
#include "bagua/net/engine.h"
#include "bagua/net/params.h"
#include "ext.h"
#include "tuner.h"  // net_plugin private: the tuner's catalogue (as bagua-params reads it)

namespace bagua::py {

namespace {

std::vector<ParamCatalogue*> netCatalogues() {
  return {&net::netParams(), &net::tuner::tunerParams()};
}

// Every knob of the plugin's catalogues, in declaration order, read from this process's
// environment (each value is read once and then frozen, as in the plugin).
pyb::list netParams() {
  pyb::list out;
  for (ParamCatalogue* c : netCatalogues()) {
    for (ParamBase* p : c->params()) {
      pyb::dict d;
      d["key"] = p->key();
      d["type"] = paramTypeName(p->type());
      d["default"] = p->defaultString();
      d["accepted"] = p->acceptedString();
      Result<std::string> value = p->valueString();
      if (value.isOk()) {
        d["value"] = *value;
        d["source"] = paramSourceName(p->source());
        d["error"] = pyb::none();
      } else {
        d["value"] = pyb::none();
        d["source"] = "environment";
        d["error"] = value.status().message();
      }
      out.append(d);
    }
  }
  return out;
}

// One line per bad setting: "KEY='value' is invalid (why); accepted: ...". When every knob parses,
// also the engine's checks across knobs (EngineOptions::fromParams, what the plugin's init runs).
std::vector<std::string> checkNetParams() {
  std::vector<std::string> errors;
  for (ParamCatalogue* c : netCatalogues()) {
    for (ParamBase* p : c->params()) {
      Status s = p->load();
      if (!s.isOk()) {
        errors.push_back(s.message());
      }
    }
  }
  if (errors.empty()) {
    Result<net::EngineOptions> options = net::EngineOptions::fromParams();
    if (!options.isOk()) {
      errors.push_back(options.status().message());
    }
  }
  return errors;
}

}  // namespace

void bindParams(pyb::module_& m) {
  m.def("net_params", &netParams,
        "Bagua-Net's parameters (the plugin's catalogues, BAGUA_NET_* and the NCCL variables "
        "it reads) as this process reads them: a list of dicts with key, type, default, "
        "accepted, value and source (None and 'environment' for a bad value) and error (None, "
        "or the message naming the key, the value and what is accepted).");
  m.def("check_net_params", &checkNetParams,
        "Validates every Bagua-Net parameter with the plugin's own parsers: a list of error "
        "lines (empty when all are valid), each naming the variable, its value and what it "
        "accepts; then the checks across parameters that the plugin's init makes.");
}

}  // namespace bagua::py
