// Gradient-ready hooks that run no Python code: one GradReadyHook per parameter, a C++ callable
// that torch calls when the parameter's gradient is accumulated (register_post_accumulate_grad_hook
// from torch 2.1, the AccumulateGrad node's hook before), and that hands the gradient's address
// straight to the reducer. Python runs only once per backward (HookState::onFirst: the
// end-of-backward callback, the no_sync state) and, where buckets are stepped inside the backward
// pass on a device, when buckets were reduced (onReduced): never per gradient.
//
// Without libtorch the hook reads the gradient through the Python C API (`param.grad`,
// `.is_sparse`, `.is_contiguous()`, `.data_ptr()`): a few attribute lookups and calls, no
// bytecode. A gradient the fast path cannot take (sparse, not contiguous) goes to Python
// (slowPath), which raises or makes it contiguous.
//
// Thread model: torch calls the hooks on autograd's threads (CPU: the thread that called
// backward; CUDA: the device's thread), one at a time per backward, holding the GIL; the reducer
// call releases it. The wrap's Python code changes the state between backward passes only
// (attach, detach, end_backward from the end-of-backward callback).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "bagua/core/ddp.h"
#include "bagua/optimizer/params.h"
#include "ext.h"

namespace bagua::py {

namespace {

// Interned attribute names, made once and kept for the process's life (a static pyb::object
// would be released after the interpreter is gone).
PyObject* name(const char* s) {
  PyObject* o = PyUnicode_InternFromString(s);
  if (o == nullptr) {
    throw pyb::error_already_set();
  }
  return o;
}

struct Names {
  PyObject* grad = name("grad");
  PyObject* isSparse = name("is_sparse");
  PyObject* isContiguous = name("is_contiguous");
  PyObject* dataPtr = name("data_ptr");
};

const Names& names() {
  static const Names* n = new Names();  // leaked on purpose (see name())
  return *n;
}

pyb::object steal(PyObject* o) {
  if (o == nullptr) {
    throw pyb::error_already_set();
  }
  return pyb::reinterpret_steal<pyb::object>(o);
}

// What every hook of one wrap shares.
struct HookState {
  // The _bagua_ext.Reducer, held weakly: the hooks live on the parameters, which may outlive the
  // wrap (an optimizer still holds them), and must not keep its reducer alive. `ddp` is used only
  // while the reference is alive.
  pyb::object reducer = pyb::none();
  core::DistributedDataParallel* ddp = nullptr;

  bool attached() const {
    return ddp != nullptr && !reducer.is_none() && PyWeakref_GetObject(reducer.ptr()) != Py_None;
  }
  pyb::object onFirst = pyb::none();    // () -> bool: whether this backward communicates
  pyb::object onReduced = pyb::none();  // () -> None, or None: buckets were reduced
  pyb::object slowPath = pyb::none();   // (index, param) -> None
  std::vector<uint8_t> communicated;    // per parameter index (the reducer's order)
  std::vector<uint8_t> used;            // per parameter index: its hook ran in this backward
  bool inBackward = false;
  bool sync = true;
  int reducedSeen = 0;
  int64_t calls = 0;        // hooks run since attach (tests and the profile read it)
  int64_t pythonCalls = 0;  // calls into Python from hooks since attach
};

class GradReadyHook {
 public:
  // `param`: a weak reference to the parameter (AccumulateGrad hooks get gradients, not the
  // parameter), or None when torch passes the parameter (post-accumulate-grad hooks).
  GradReadyHook(std::shared_ptr<HookState> state, int index, pyb::object param)
      : state_(std::move(state)), index_(index), param_(std::move(param)) {}

  void call(pyb::args args) {
    HookState& st = *state_;
    if (!st.attached()) {
      return;  // detached: the wrap was closed or rebuilt, or its reducer is gone
    }
    ++st.calls;
    if (!st.inBackward) {
      st.inBackward = true;
      std::fill(st.used.begin(), st.used.end(), 0);
      st.reducedSeen = 0;
      ++st.pythonCalls;
      try {
        st.sync = st.onFirst().cast<bool>();
      } catch (...) {
        st.inBackward = false;  // the backward fails: the next one starts afresh
        throw;
      }
      if (!st.attached()) {
        return;  // onFirst closed the wrap
      }
    }
    const auto i = static_cast<size_t>(index_);
    if (i < st.used.size()) {
      st.used[i] = 1;
    }
    if (!st.sync || i >= st.communicated.size() || st.communicated[i] == 0) {
      return;
    }
    pyb::object param;
    if (param_.is_none()) {
      if (args.size() != 1) {
        throw pyb::type_error("GradReadyHook: expected the parameter as the only argument");
      }
      param = args[0];
    } else {
      param = param_();
      if (param.is_none()) {
        return;  // the parameter is gone
      }
    }
    const Names& n = names();
    pyb::object grad = steal(PyObject_GetAttr(param.ptr(), n.grad));
    if (grad.is_none()) {
      return;
    }
    pyb::object sparse = steal(PyObject_GetAttr(grad.ptr(), n.isSparse));
    pyb::object contiguous = steal(PyObject_CallMethodNoArgs(grad.ptr(), n.isContiguous));
    if (sparse.ptr() == Py_True || contiguous.ptr() != Py_True) {
      ++st.pythonCalls;
      st.slowPath(index_, param);  // raises, or makes it contiguous and marks it ready
      return;
    }
    pyb::object ptr = steal(PyObject_CallMethodNoArgs(grad.ptr(), n.dataPtr));
    const auto address = PyLong_AsUnsignedLongLong(ptr.ptr());
    if (PyErr_Occurred() != nullptr) {
      throw pyb::error_already_set();
    }
    std::vector<core::Parameter>& params = st.ddp->parameters();
    if (i >= params.size()) {
      throw pyb::index_error("GradReadyHook: parameter index out of range");
    }
    params[i].grad = reinterpret_cast<void*>(static_cast<uintptr_t>(address));
    Status s;
    {
      pyb::gil_scoped_release nogil;
      s = st.ddp->markGradReady(index_);
    }
    check(s);
    if (!st.onReduced.is_none() && st.attached()) {
      const int reduced = st.ddp->bucketsReduced();
      if (reduced > st.reducedSeen) {
        st.reducedSeen = reduced;
        ++st.pythonCalls;
        st.onReduced();
      }
    }
  }

 private:
  std::shared_ptr<HookState> state_;
  int index_;
  pyb::object param_;
};

}  // namespace

void bindHooks(pyb::module_& m) {
  pyb::class_<HookState, std::shared_ptr<HookState>>(m, "HookState")
      .def(pyb::init<>())
      .def(
          "attach",
          [](HookState& st, pyb::object reducer, std::vector<int> communicated, int numParams,
             pyb::object onFirst, pyb::object onReduced, pyb::object slowPath) {
            st.ddp = &reducerOf(reducer);
            st.reducer = pyb::weakref(reducer);
            st.communicated.assign(static_cast<size_t>(numParams), 0);
            for (int c : communicated) {
              if (c < 0 || c >= numParams) {
                throw pyb::value_error("HookState.attach: communicated index out of range");
              }
              st.communicated[static_cast<size_t>(c)] = 1;
            }
            st.used.assign(static_cast<size_t>(numParams), 0);
            st.onFirst = std::move(onFirst);
            st.onReduced = std::move(onReduced);
            st.slowPath = std::move(slowPath);
            st.inBackward = false;
          },
          pyb::arg("reducer"), pyb::arg("communicated"), pyb::arg("num_params"),
          pyb::arg("on_first"), pyb::arg("on_reduced"), pyb::arg("slow_path"),
          "Binds the hooks to a reducer (kept alive until detach) and the wrap's callbacks.")
      .def(
          "detach",
          [](HookState& st) {
            st.ddp = nullptr;
            st.reducer = pyb::none();
            st.onFirst = pyb::none();
            st.onReduced = pyb::none();
            st.slowPath = pyb::none();
            st.inBackward = false;
          },
          "From now on every hook returns at once; the reducer and callbacks are released.")
      .def(
          "end_backward", [](HookState& st) { st.inBackward = false; },
          "The end-of-backward callback ran: the next hook starts a new backward.")
      .def(
          "set_on_reduced", [](HookState& st, pyb::object f) { st.onReduced = std::move(f); },
          pyb::arg("callback"))
      .def_property_readonly("in_backward", [](const HookState& st) { return st.inBackward; })
      .def_property_readonly("used",
                             [](const HookState& st) {
                               std::vector<int> out;
                               for (size_t i = 0; i < st.used.size(); ++i) {
                                 if (st.used[i] != 0) {
                                   out.push_back(static_cast<int>(i));
                                 }
                               }
                               return out;
                             })
      .def_property_readonly("calls", [](const HookState& st) { return st.calls; })
      .def_property_readonly("python_calls", [](const HookState& st) { return st.pythonCalls; });

  // BAGUA_OPTIM_STEP_IN_BACKWARD (the optimizer library's catalogue), for the Python engine.
  m.def("optim_step_in_backward", [] {
    Result<bool> on = optim::optimizerParams().stepInBackward.get();
    if (!on.isOk()) {
      throw pyb::value_error(on.status().toString());
    }
    return *on;
  });

  pyb::class_<GradReadyHook>(m, "GradReadyHook")
      .def(pyb::init<std::shared_ptr<HookState>, int, pyb::object>(), pyb::arg("state"),
           pyb::arg("index"), pyb::arg("param") = pyb::none())
      .def("__call__", &GradReadyHook::call);
}

}  // namespace bagua::py
