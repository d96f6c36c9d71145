#include "bagua/python/params.h"

namespace bagua::py {

PythonParams& pythonParams() {
  static PythonParams params;
  return params;
}

}  // namespace bagua::py
