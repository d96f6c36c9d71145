// The CUDA MinMaxUInt8 kernels against the CPU ones, bit for bit (compressed bytes and
// decompressed floats), over sizes, chunk counts, target chunks and the edge cases. Skipped,
// with the reason, when no CUDA device is visible.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "bagua/algorithms/compression.h"
#include "bagua/algorithms/cuda_compression.h"

namespace bagua::algo {
namespace {

class CudaCompression : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (!cudaCompressionAvailable()) {
      GTEST_SKIP() << "bagua built without the CUDA kernels";
    }
    if (e != cudaSuccess || n == 0) {
      GTEST_SKIP() << "no CUDA device visible (" << cudaGetErrorString(e) << ", " << n
                   << " devices): the GPU comparison runs on the GPU machine";
    }
  }

  // Compresses and decompresses x on both sides and compares every byte and every float.
  void compare(const std::vector<float>& x, size_t chunks, int target = -1) {
    const size_t n = x.size();
    const size_t bytes = minMaxCompressedBytes(n, chunks);
    std::vector<uint8_t> cpu(bytes, 0x5A), gpu(bytes, 0x5A);
    ASSERT_TRUE(minMaxCompress(x.data(), n, chunks, cpu.data(), bytes, target).isOk());
    float* dx = nullptr;
    uint8_t* dc = nullptr;
    float* dy = nullptr;
    void* ws = nullptr;
    const size_t wsBytes = minMaxCudaWorkspaceBytes(n, chunks);
    ASSERT_EQ(cudaMalloc(&dx, std::max<size_t>(n, 1) * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dc, bytes), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dy, std::max<size_t>(n, 1) * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&ws, std::max<size_t>(wsBytes, 16)), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dx, x.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dc, gpu.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_TRUE(minMaxCompressCuda(dx, n, chunks, dc, bytes, ws, wsBytes, target).isOk());
    ASSERT_EQ(cudaMemcpy(gpu.data(), dc, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t b = 0; b < bytes; ++b) {
      ASSERT_EQ(gpu[b], cpu[b]) << "byte " << b << " of " << bytes << ", " << n << " elements, "
                                << chunks << " chunks, target " << target;
    }
    std::vector<float> ycpu(n, 3.0f), ygpu(n, 3.0f);
    ASSERT_EQ(cudaMemcpy(dy, ygpu.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_TRUE(minMaxDecompress(cpu.data(), bytes, n, chunks, ycpu.data(), target).isOk());
    ASSERT_TRUE(minMaxDecompressCuda(dc, bytes, n, chunks, dy, target).isOk());
    ASSERT_EQ(cudaMemcpy(ygpu.data(), dy, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(std::memcmp(ycpu.data(), ygpu.data(), n * 4), 0) << n << " elements";
    cudaFree(dx);
    cudaFree(dc);
    cudaFree(dy);
    cudaFree(ws);
  }
};

std::vector<float> data(size_t n, uint32_t seed, float spread) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, spread);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = d(rng) + static_cast<float>((i / 1000) % 7);
  }
  return x;
}

TEST_F(CudaCompression, BitIdenticalToCpu) {
  for (size_t n : {1u, 31u, 32u, 33u, 1000u, 4097u, 100003u, 3000000u}) {
    for (size_t chunks : {1u, 2u, 3u, 8u}) {
      compare(data(n, static_cast<uint32_t>(n + chunks), 2.0f), chunks);
    }
  }
}

TEST_F(CudaCompression, TargetChunks) {
  const auto x = data(50000, 5, 1.0f);
  for (int t = 0; t < 4; ++t) {
    compare(x, 4, t);
  }
}

TEST_F(CudaCompression, EdgeCases) {
  compare({}, 4);                            // zero length
  compare(std::vector<float>(77, 1.0f), 2);  // constant chunk (clamp)
  compare(std::vector<float>(77, 0.0f), 3);
  std::vector<float> zeros = {-0.0f, 0.0f, -0.0f, 1.0f, -0.0f};  // -0 canonicalised
  compare(zeros, 1);
  auto x = data(10000, 9, 1.0f);
  x[2500] = std::numeric_limits<float>::quiet_NaN();
  x[7000] = std::numeric_limits<float>::infinity();
  compare(x, 4);  // NaN policy on chunks 1 and 2
  compare({-3e38f, 3e38f, 0.0f}, 1);
  compare({1.0f, 2.0f, 3.0f}, 5);  // empty tail chunks
}

}  // namespace
}  // namespace bagua::algo
