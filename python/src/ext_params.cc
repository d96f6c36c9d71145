// The parameter catalogues as the Python package reads them:
// - param(key): one knob's value from this process's environment as it is now, parsed and
//   validated by the knob's own declaration (the C++ catalogue that owns the key), with the same
//   default and the same error text as the library that reads it. The package's only way to read
//   its configuration (bagua/_catalogue.py).
// - params(): every knob of every catalogue (what bagua-params lists), for tests and tools.
// - net_params() / check_net_params(): Bagua-Net's settings for `python -m bagua.net --check`:
//   the plugin's own catalogues (bagua/net/params.h and the tuner's) parse and validate each
//   value, so the check and the plugin cannot disagree on what is accepted.
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "bagua/algorithms/params.h"
#include "bagua/autotune/params.h"
#include "bagua/base/logging.h"
#include "bagua/base/params.h"
#include "bagua/core/params.h"
#include "bagua/dataset_cache/params.h"
#include "bagua/loader/params.h"
#include "bagua/net/engine.h"
#include "bagua/net/params.h"
#include "bagua/optimizer/params.h"
#include "bagua/python/params.h"
#include "ext.h"
#include "tuner.h"  // net_plugin private: the tuner's catalogue (as bagua-params reads it)

namespace bagua::py {

namespace {

// A catalogue: the process's instance (the one its library reads, frozen at first use, and the
// one bagua-params dumps) and a maker of a fresh instance of the same declaration.
struct CatalogueKind {
  ParamCatalogue& (*instance)();
  std::unique_ptr<ParamCatalogue> (*fresh)();
};

template <typename C, C& (*Instance)()>
CatalogueKind kind() {
  return {[]() -> ParamCatalogue& { return Instance(); },
          []() -> std::unique_ptr<ParamCatalogue> { return std::make_unique<C>(); }};
}

// Every catalogue, in bagua-params' order.
const std::vector<CatalogueKind>& catalogueKinds() {
  static const std::vector<CatalogueKind> kinds = {
      kind<BaseParams, baseParams>(),
      kind<core::CoreParams, core::coreParams>(),
      kind<cache::CacheParams, cache::cacheParams>(),
      kind<loader::LoaderParams, loader::loaderParams>(),
      kind<net::NetParams, net::netParams>(),
      kind<net::tuner::TunerParams, net::tuner::tunerParams>(),
      kind<autotune::AutotuneParams, autotune::autotuneParams>(),
      kind<optim::OptimizerParams, optim::optimizerParams>(),
      kind<algo::AlgorithmsParams, algo::algorithmsParams>(),
      kind<PythonParams, pythonParams>(),
  };
  return kinds;
}

template <typename T>
pyb::tuple typedRead(ParamBase& p) {
  auto& typed = dynamic_cast<Param<T>&>(p);
  T value = take(typed.get());
  return pyb::make_tuple(pyb::cast(value), paramSourceName(typed.source()),
                         pyb::cast(typed.defaultValue()));
}

// (value, source, default) of `key`, read now: a fresh instance of the catalogue that declares
// the key loads it from the environment as it is at this call (the process's instances freeze a
// value at their first read, and init_process_group(rank=...) sets RANK before reading it). A bad
// value raises InvalidArgumentError with the catalogue's message (key, value, what is accepted);
// a key no catalogue declares raises KeyError.
pyb::tuple readParam(const std::string& key) {
  for (const CatalogueKind& k : catalogueKinds()) {
    if (k.instance().find(key) == nullptr) {
      continue;
    }
    std::unique_ptr<ParamCatalogue> c = k.fresh();
    ParamBase& p = *c->find(key);
    switch (p.type()) {
    case ParamType::kBool:
      return typedRead<bool>(p);
    case ParamType::kInt:
      return typedRead<int64_t>(p);
    case ParamType::kDouble:
      return typedRead<double>(p);
    case ParamType::kBytes:
      return typedRead<uint64_t>(p);
    case ParamType::kString:
    case ParamType::kEnum:
      return typedRead<std::string>(p);
    }
  }
  throw pyb::key_error(key +
                       " is declared in no bagua parameter catalogue (bagua-params lists "
                       "every one)");
}

// Every knob's declaration (no values: nothing is read), in bagua-params' order.
pyb::list listParams() {
  pyb::list out;
  for (const CatalogueKind& k : catalogueKinds()) {
    ParamCatalogue& c = k.instance();
    for (ParamBase* p : c.params()) {
      pyb::dict d;
      d["library"] = c.library();
      d["key"] = p->key();
      d["type"] = paramTypeName(p->type());
      d["default"] = p->defaultString();
      d["accepted"] = p->acceptedString();
      d["description"] = p->description();
      out.append(d);
    }
  }
  return out;
}

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
  m.def("param", &readParam, pyb::arg("key"),
        "(value, source, default) of one knob of the bagua catalogues, read from the environment "
        "as it is now and parsed by the knob's own declaration: value and default typed (bool, "
        "int, float or str; bytes as an int), source 'default' or 'environment'. A bad value "
        "raises InvalidArgumentError (a ValueError) naming the key, the value and what is "
        "accepted, as the C++ libraries report it; an unknown key raises KeyError.");
  m.def("params", &listParams,
        "Every knob of every bagua catalogue (what bagua-params lists), as dicts with library, "
        "key, type, default, accepted and description; no value is read.");
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
