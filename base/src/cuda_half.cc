#include "bagua/base/cuda_half.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

#include "bagua/base/logging.h"

namespace bagua::detail {

namespace {

// The folder of the loaded object holding `anchor` (empty where that is the executable itself,
// whose folder is no install location).
std::string folderOf(const void* anchor) {
  Dl_info info{};
  if (anchor == nullptr || dladdr(anchor, &info) == 0 || info.dli_fname == nullptr) {
    return "";
  }
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

}  // namespace

Status loadCudaHalf(const CudaHalfSpec& spec, bool (*registered)(const void* half),
                    const void* half) {
  if (spec.soname == nullptr) {
    return BAGUA_ERROR(kFailedPrecondition,
                       "%s was not built (bagua was configured without %s); %s, or configure "
                       "with %s",
                       spec.what, spec.links, spec.instead, spec.configure);
  }
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (registered(half)) {
    return Status::ok();
  }
  // RTLD_NODELETE: the backend object lives in the library, so it must never be unloaded.
  const int flags = RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE;
  std::string why;
  void* handle = dlopen(spec.soname, flags);
  if (handle == nullptr) {
    const char* e = dlerror();
    why = e != nullptr ? e : "not found";
    const std::string folder = folderOf(spec.anchor);
    if (!folder.empty()) {
      const std::string beside = folder + "/" + spec.soname;
      handle = dlopen(beside.c_str(), flags);
      if (handle == nullptr) {
        e = dlerror();
        why = e != nullptr ? e : "not found";
      }
    }
  }
  if (handle == nullptr) {
    return BAGUA_ERROR(
        kFailedPrecondition,
        "%s was requested, but %s (%s) is not installed or does not load: %s. Install "
        "the SDK's CUDA part beside %s (meson install of a build with CUDA) and "
        "make %s loadable, or %s",
        spec.what, spec.soname, spec.links, why.c_str(), spec.library, spec.needs, spec.instead);
  }
  if (!registered(half)) {
    return BAGUA_ERROR(kInternal, "%s loaded but registered nothing (another version?)",
                       spec.soname);
  }
  BAGUA_LOG_INFO(kLogInit, "loaded %s (%s)", spec.soname, spec.what);
  return Status::ok();
}

}  // namespace bagua::detail
