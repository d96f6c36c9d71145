// Built without CUDA: the GPU kernels are absent and say so.
#include "bagua/algorithms/cuda_compression.h"

namespace bagua::algo {

namespace {
Status absent() {
  return BAGUA_ERROR(kFailedPrecondition,
                     "MinMaxUInt8 CUDA kernels: bagua was built without CUDA (configure with "
                     "-Dcuda=enabled on a machine with nvcc)");
}
}  // namespace

bool cudaCompressionAvailable() {
  return false;
}
size_t minMaxCudaWorkspaceBytes(size_t /*numel*/, size_t /*chunks*/) {
  return 0;
}

Status minMaxCompressCuda(const float* /*src*/, size_t /*numel*/, size_t /*chunks*/,
                          uint8_t* /*dst*/, size_t /*dstBytes*/, void* /*workspace*/,
                          size_t /*workspaceBytes*/, int /*targetChunk*/, void* /*stream*/) {
  return absent();
}

Status minMaxDecompressCuda(const uint8_t* /*src*/, size_t /*srcBytes*/, size_t /*numel*/,
                            size_t /*chunks*/, float* /*dst*/, int /*targetChunk*/,
                            void* /*stream*/) {
  return absent();
}

}  // namespace bagua::algo
