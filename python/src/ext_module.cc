// The _bagua_ext module: process groups and collectives, the reducer and the algorithms, and the
// contrib pieces (samplers, dataset cache). The Python package bagua.torch_api wraps it.
#include <pybind11/pybind11.h>

#include "bagua_config.h"
#include "ext.h"

namespace bagua::py {

void registerExceptions(pyb::module_& m) {
  pyb::module_ builtins = pyb::module_::import("builtins");
  pyb::dict ns;
  ns["__module__"] = "_bagua_ext";
  ns["__doc__"] = "A bad argument (InvalidArgument): a ValueError, and a RuntimeError as well.";
  pyb::object cls = builtins.attr("type")(
      "InvalidArgumentError",
      pyb::make_tuple(builtins.attr("ValueError"), builtins.attr("RuntimeError")), ns);
  m.attr("InvalidArgumentError") = cls;
  // The class lives as long as the module; the translator keeps a borrowed pointer to it.
  static PyObject* type = cls.ptr();
  pyb::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) {
        std::rethrow_exception(p);
      }
    } catch (const InvalidArgumentError& e) {
      PyErr_SetString(type, e.what());
    }
  });
}

}  // namespace bagua::py

PYBIND11_MODULE(_bagua_ext, m) {
  m.doc() = "bagua C++ core for the bagua.torch_api package (no libtorch: raw pointers)";
  m.attr("__version__") = BAGUA_VERSION;
  m.attr("HAVE_NCCL") = static_cast<bool>(BAGUA_PY_WITH_NCCL);
  bagua::py::registerExceptions(m);
  bagua::py::bindComm(m);
  bagua::py::bindDdp(m);
  bagua::py::bindHooks(m);
  bagua::py::bindContrib(m);
  bagua::py::bindParams(m);
}
