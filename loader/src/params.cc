#include "bagua/loader/params.h"

namespace bagua::loader {

LoaderParams& loaderParams() {
  static LoaderParams params;
  return params;
}

}  // namespace bagua::loader
