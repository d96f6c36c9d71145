// The _bagua_ext module: process groups and collectives, the reducer and the algorithms, and the
// contrib pieces (samplers, dataset cache). The Python package bagua.torch_api wraps it.
#include <pybind11/pybind11.h>

#include "bagua_config.h"
#include "ext.h"

PYBIND11_MODULE(_bagua_ext, m) {
  m.doc() = "bagua C++ core for the bagua.torch_api package (no libtorch: raw pointers)";
  m.attr("__version__") = BAGUA_VERSION;
  m.attr("HAVE_NCCL") = static_cast<bool>(BAGUA_PY_WITH_NCCL);
  bagua::py::bindComm(m);
  bagua::py::bindDdp(m);
  bagua::py::bindContrib(m);
}
