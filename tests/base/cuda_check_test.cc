// BAGUA_CHECK_CUDA / BAGUA_CUDA_STATUS / cudaStatus (bagua/base/cuda_check.h). Needs the CUDA
// runtime library but no GPU: the error codes are made up, and CUDA names them without a device.
#include "bagua/base/cuda_check.h"

#include <gtest/gtest.h>

namespace bagua {
namespace {

int calls = 0;

// Stands in for a CUDA runtime call that returns `e`.
cudaError_t fakeCall(cudaError_t e) {
  ++calls;
  return e;
}

Status checked(cudaError_t e, bool* reachedEnd) {
  BAGUA_CHECK_CUDA(fakeCall(e));
  *reachedEnd = true;
  return Status::ok();
}

Status checkedWithContext(cudaError_t e, int bucket) {
  BAGUA_CHECK_CUDA(fakeCall(e), "bucket %d of %s", bucket, "the reducer");
  return Status::ok();
}

Result<int> checkedResult(cudaError_t e) {
  BAGUA_CHECK_CUDA(fakeCall(e));
  return 7;
}

TEST(CudaCheck, SuccessIsOk) {
  EXPECT_TRUE(cudaStatus(cudaSuccess, "anything").isOk());
  EXPECT_TRUE(BAGUA_CUDA_STATUS(fakeCall(cudaSuccess)).isOk());
  bool reachedEnd = false;
  calls = 0;
  EXPECT_TRUE(checked(cudaSuccess, &reachedEnd).isOk());
  EXPECT_TRUE(reachedEnd);
  EXPECT_EQ(calls, 1);  // the call is evaluated once
  Result<int> r = checkedResult(cudaSuccess);
  ASSERT_TRUE(r.isOk());
  EXPECT_EQ(*r, 7);
}

TEST(CudaCheck, ErrorNamesTheCallTheErrorAndItsOrigin) {
  const Status s = cudaStatus(cudaErrorMemoryAllocation, "cudaMalloc(&p, 64)", "alloc.cc", 12);
  EXPECT_EQ(s.code(), StatusCode::kCudaError);
  EXPECT_EQ(s.message(), std::string("cudaMalloc(&p, 64): ") +
                             cudaGetErrorString(cudaErrorMemoryAllocation) +
                             " (cudaErrorMemoryAllocation)");
  EXPECT_EQ(s.origin(), "alloc.cc:12");

  const Status m = BAGUA_CUDA_STATUS(fakeCall(cudaErrorInvalidValue));
  EXPECT_EQ(m.code(), StatusCode::kCudaError);
  EXPECT_EQ(m.message().rfind("fakeCall(cudaErrorInvalidValue): ", 0), 0u) << m.message();
  EXPECT_NE(m.message().find("(cudaErrorInvalidValue)"), std::string::npos) << m.message();
  EXPECT_NE(m.origin().find("cuda_check_test.cc:"), std::string::npos) << m.origin();
}

TEST(CudaCheck, CheckReturnsTheErrorBeforeTheRestOfTheFunction) {
  bool reachedEnd = false;
  calls = 0;
  const Status s = checked(cudaErrorInvalidDevice, &reachedEnd);
  EXPECT_FALSE(reachedEnd);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(s.code(), StatusCode::kCudaError);
  EXPECT_EQ(s.message().rfind("fakeCall(e): ", 0), 0u) << s.message();
  EXPECT_NE(s.message().find("(cudaErrorInvalidDevice)"), std::string::npos) << s.message();

  Result<int> r = checkedResult(cudaErrorNotReady);
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kCudaError);
  EXPECT_NE(r.status().message().find("(cudaErrorNotReady)"), std::string::npos);
}

TEST(CudaCheck, ContextGoesInFront) {
  const Status s = checkedWithContext(cudaErrorInvalidValue, 3);
  EXPECT_EQ(s.code(), StatusCode::kCudaError);
  EXPECT_EQ(s.message().rfind("bucket 3 of the reducer: fakeCall(e): ", 0), 0u) << s.message();
  EXPECT_NE(s.message().find("(cudaErrorInvalidValue)"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace bagua
