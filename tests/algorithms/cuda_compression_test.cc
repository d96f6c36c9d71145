// The CUDA MinMaxUInt8 kernels against the CPU ones, bit for bit (compressed bytes and
// decompressed floats), over sizes, chunk counts, target chunks and the edge cases. Skipped,
// with the reason, when no CUDA device is visible.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
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
  // srcOffset (floats) and dstOffset (bytes, a multiple of 4) shift the device buffers off their
  // 256-byte cudaMalloc alignment, so the kernels' scalar paths run.
  // Every word of the workspace (the per-chunk accumulators and counters) is 0 between calls:
  // the last quantise block of each chunk resets them, so one zeroed workspace serves any later
  // geometry.
  static void expectCountersZero(const void* ws, size_t wsBytes, const std::string& what) {
    std::vector<uint32_t> words(wsBytes / 4);
    ASSERT_EQ(cudaMemcpy(words.data(), ws, words.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < words.size(); ++i) {
      ASSERT_EQ(words[i], 0u) << "workspace word " << i << " after " << what;
    }
  }

  // sharedWs: a workspace zeroed once by the caller and reused (its bytes are checked to be
  // enough); otherwise a fresh one, zeroed as the API asks.
  void compare(const std::vector<float>& x, size_t chunks, int target = -1, size_t srcOffset = 0,
               size_t dstOffset = 0, void* sharedWs = nullptr, size_t sharedWsBytes = 0) {
    const size_t n = x.size();
    const size_t bytes = minMaxCompressedBytes(n, chunks);
    std::vector<uint8_t> cpu(bytes, 0x5A), gpu(bytes, 0x5A);
    ASSERT_TRUE(minMaxCompress(x.data(), n, chunks, cpu.data(), bytes, target).isOk());
    float* dxBase = nullptr;
    uint8_t* dcBase = nullptr;
    float* dyBase = nullptr;
    void* ws = sharedWs;
    const size_t wsBytes =
        sharedWs != nullptr ? sharedWsBytes : minMaxCudaWorkspaceBytes(n, chunks);
    ASSERT_GE(wsBytes, minMaxCudaWorkspaceBytes(n, chunks));
    ASSERT_EQ(cudaMalloc(&dxBase, (n + srcOffset + 1) * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dcBase, bytes + dstOffset + 1), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dyBase, (n + srcOffset + 1) * 4), cudaSuccess);
    if (sharedWs == nullptr) {
      ASSERT_EQ(cudaMalloc(&ws, std::max<size_t>(wsBytes, 16)), cudaSuccess);
      ASSERT_EQ(cudaMemset(ws, 0, std::max<size_t>(wsBytes, 16)), cudaSuccess);
    }
    float* dx = dxBase + srcOffset;
    uint8_t* dc = dcBase + dstOffset;
    float* dy = dyBase + srcOffset;
    ASSERT_EQ(cudaMemcpy(dx, x.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dc, gpu.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
    const Status cs = minMaxCompressCuda(dx, n, chunks, dc, bytes, ws, wsBytes, target);
    ASSERT_TRUE(cs.isOk()) << cs.toString();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(gpu.data(), dc, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t b = 0; b < bytes; ++b) {
      ASSERT_EQ(gpu[b], cpu[b]) << "byte " << b << " of " << bytes << ", " << n << " elements, "
                                << chunks << " chunks, target " << target << ", offsets "
                                << srcOffset << "/" << dstOffset;
    }
    std::vector<float> ycpu(n, 3.0f), ygpu(n, 3.0f);
    ASSERT_EQ(cudaMemcpy(dy, ygpu.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_TRUE(minMaxDecompress(cpu.data(), bytes, n, chunks, ycpu.data(), target).isOk());
    const Status ds = minMaxDecompressCuda(dc, bytes, n, chunks, dy, target);
    ASSERT_TRUE(ds.isOk()) << ds.toString();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(ygpu.data(), dy, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < n; ++i) {
      uint32_t a = 0, b = 0;
      std::memcpy(&a, &ycpu[i], 4);
      std::memcpy(&b, &ygpu[i], 4);
      ASSERT_EQ(a, b) << "element " << i << " of " << n << ", " << chunks << " chunks, target "
                      << target << ", offsets " << srcOffset << "/" << dstOffset;
    }
    cudaFree(dxBase);
    cudaFree(dcBase);
    cudaFree(dyBase);
    if (sharedWs == nullptr) {
      cudaFree(ws);
    }
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
  for (size_t n : {1u, 31u, 32u, 33u, 1000u, 4097u, 100003u, 3000000u, (1u << 22) + 8u}) {
    for (size_t chunks : {1u, 2u, 3u, 8u}) {
      compare(data(n, static_cast<uint32_t>(n + chunks), 2.0f), chunks);
    }
  }
}

// Sizes that are not multiples of 4 put chunk starts off the 16-byte boundary (the scalar
// head/tail of pass 1, the scalar loads of quantise and stores of decompress); 1 << 20 + 3 with
// several chunks spans many tiles per chunk.
TEST_F(CudaCompression, AlignmentPaths) {
  for (size_t n : {1u, 3u, 5u, 4097u, (1u << 20) + 3u}) {
    for (size_t chunks = 1; chunks <= 8; ++chunks) {
      compare(data(n, static_cast<uint32_t>(7 * n + chunks), 3.0f), chunks);
    }
  }
}

// Device buffers off their allocation alignment: source and destination by one float, the
// compressed buffer by 4 bytes.
TEST_F(CudaCompression, UnalignedBuffers) {
  for (size_t n : {5u, 4096u, 65536u, 100003u}) {
    for (size_t chunks : {1u, 3u, 4u}) {
      const auto x = data(n, static_cast<uint32_t>(n + 11 * chunks), 1.5f);
      compare(x, chunks, -1, 1, 0);
      compare(x, chunks, -1, 0, 4);
      compare(x, chunks, -1, 3, 12);
    }
  }
}

TEST_F(CudaCompression, RejectsMisalignedPointers) {
  uint8_t* buf = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, 4096), cudaSuccess);
  const size_t bytes = minMaxCompressedBytes(16, 1);
  const Status s = minMaxCompressCuda(reinterpret_cast<const float*>(buf), 16, 1, buf + 2049, bytes,
                                      buf + 3072, 1024);
  EXPECT_FALSE(s.isOk());
  EXPECT_NE(s.toString().find("aligned"), std::string::npos) << s.toString();
  const Status d =
      minMaxDecompressCuda(buf + 1, bytes, 16, 1, reinterpret_cast<float*>(buf + 2048));
  EXPECT_FALSE(d.isOk());
  cudaFree(buf);
}

TEST_F(CudaCompression, TargetChunks) {
  const auto x = data(50000, 5, 1.0f);
  for (int t = 0; t < 4; ++t) {
    compare(x, 4, t);
  }
  const auto y = data(4097, 6, 1.0f);  // chunks of 586 elements: unaligned starts
  for (int t = 0; t < 7; ++t) {
    compare(y, 7, t);
  }
}

// One workspace, zeroed once, through many geometries in a row (large, small, large again,
// target chunks, repeats): a counter left non-zero by a call, or a slot word of one geometry
// taken for a counter of the next, would give a wrong header and bytes.
TEST_F(CudaCompression, WorkspaceReusedAcrossGeometries) {
  struct Case {
    size_t n;
    size_t chunks;
    int target;
  };
  const Case cases[] = {{(1u << 22) + 8u, 1, -1},
                        {(1u << 22) + 8u, 8, -1},
                        {4097, 7, -1},
                        {1000, 3, -1},
                        {(1u << 20) + 3u, 5, -1},
                        {50000, 4, 2},
                        {(1u << 22) + 8u, 8, -1},
                        {100003, 2, -1},
                        {(1u << 22) + 8u, 1, -1},
                        {5, 8, -1},
                        {(1u << 20) + 3u, 5, 4},
                        {(1u << 20) + 3u, 5, -1}};
  size_t wsBytes = 16;
  for (const Case& c : cases) {
    wsBytes = std::max(wsBytes, minMaxCudaWorkspaceBytes(c.n, c.chunks));
  }
  void* ws = nullptr;
  ASSERT_EQ(cudaMalloc(&ws, wsBytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(ws, 0, wsBytes), cudaSuccess);
  uint32_t seed = 100;
  for (const Case& c : cases) {
    for (int rep = 0; rep < 2; ++rep) {
      compare(data(c.n, ++seed, 1.0f + static_cast<float>(rep)), c.chunks, c.target, 0, 0, ws,
              wsBytes);
      if (HasFatalFailure()) {
        cudaFree(ws);
        return;
      }
      expectCountersZero(
          ws, wsBytes, std::to_string(c.n) + " elements, " + std::to_string(c.chunks) + " chunks");
    }
  }
  cudaFree(ws);
}

// Compress, decompress and compress again on one stream with no host synchronisation in between,
// then a copy on the same stream: the operation after compress must see pass 1's headers even
// though quantise overlaps pass 1 (programmatic dependent launch), and decompress must see both.
TEST_F(CudaCompression, StreamOrderedWithoutSync) {
  const size_t n = (1u << 22) + 8u;
  const size_t chunks = 8;
  const size_t bytes = minMaxCompressedBytes(n, chunks);
  const auto a = data(n, 31, 2.0f);
  const auto b = data(n, 32, 5.0f);
  std::vector<uint8_t> ca(bytes), cb(bytes);
  ASSERT_TRUE(minMaxCompress(a.data(), n, chunks, ca.data(), bytes).isOk());
  ASSERT_TRUE(minMaxCompress(b.data(), n, chunks, cb.data(), bytes).isOk());
  std::vector<float> ya(n);
  ASSERT_TRUE(minMaxDecompress(ca.data(), bytes, n, chunks, ya.data()).isOk());
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  float *da = nullptr, *db = nullptr, *dy = nullptr;
  uint8_t *dc1 = nullptr, *dc2 = nullptr;
  void* ws = nullptr;
  const size_t wsBytes = minMaxCudaWorkspaceBytes(n, chunks);
  ASSERT_EQ(cudaMalloc(&da, n * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&db, n * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dy, n * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dc1, bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dc2, bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&ws, wsBytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(ws, 0, wsBytes), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(da, a.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(db, b.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  std::vector<uint8_t> g1(bytes, 0x5A), g2(bytes, 0x5A);
  std::vector<float> gy(n, 3.0f);
  for (int round = 0; round < 3; ++round) {
    ASSERT_EQ(cudaMemsetAsync(dc1, 0xA5, bytes, s), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(dc2, 0xA5, bytes, s), cudaSuccess);
    ASSERT_TRUE(minMaxCompressCuda(da, n, chunks, dc1, bytes, ws, wsBytes, -1, s).isOk());
    ASSERT_TRUE(minMaxDecompressCuda(dc1, bytes, n, chunks, dy, -1, s).isOk());
    ASSERT_TRUE(minMaxCompressCuda(db, n, chunks, dc2, bytes, ws, wsBytes, -1, s).isOk());
    ASSERT_EQ(cudaMemcpyAsync(g2.data(), dc2, bytes, cudaMemcpyDeviceToHost, s), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(g1.data(), dc1, bytes, cudaMemcpyDeviceToHost, s), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(gy.data(), dy, n * 4, cudaMemcpyDeviceToHost, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    for (size_t i = 0; i < bytes; ++i) {
      ASSERT_EQ(g1[i], ca[i]) << "first compress, byte " << i << ", round " << round;
      ASSERT_EQ(g2[i], cb[i]) << "second compress, byte " << i << ", round " << round;
    }
    for (size_t i = 0; i < n; ++i) {
      uint32_t x = 0, y = 0;
      std::memcpy(&x, &ya[i], 4);
      std::memcpy(&y, &gy[i], 4);
      ASSERT_EQ(x, y) << "decompressed element " << i << ", round " << round;
    }
  }
  expectCountersZero(ws, wsBytes, "the stream-ordered rounds");
  cudaFree(da);
  cudaFree(db);
  cudaFree(dy);
  cudaFree(dc1);
  cudaFree(dc2);
  cudaFree(ws);
  cudaStreamDestroy(s);
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
  // Non-finite values in the scalar head and tail of an unaligned chunk, and in a vector tile.
  auto y = data(4097, 10, 1.0f);
  y[586] = -std::numeric_limits<float>::infinity();   // first element of chunk 1 (of 7)
  y[4096] = std::numeric_limits<float>::quiet_NaN();  // last element of the last chunk
  y[2000] = std::numeric_limits<float>::quiet_NaN();  // inside chunk 3
  compare(y, 7);
  // Extremes only in the scalar head/tail: min at a chunk's first element, max at its last.
  auto z = data(4097, 12, 1.0f);
  z[586] = -100.0f;
  z[1171] = 100.0f;
  z[1757] = 50.0f;  // last element of chunk 2, in its scalar tail
  compare(z, 7);
}

}  // namespace
}  // namespace bagua::algo
