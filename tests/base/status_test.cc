#include "bagua/base/status.h"

#include <cerrno>

#include <gtest/gtest.h>

namespace bagua {
namespace {

Status failsWith(StatusCode code) {
  return Status(code, "inner failure", "inner.cc", 7);
}

Status propagates(StatusCode code) {
  BAGUA_RETURN_IF_ERROR(failsWith(code));
  return Status::ok();
}

Result<int> half(int v) {
  if (v % 2 != 0) {
    return BAGUA_ERROR(kInvalidArgument, "%d is odd", v);
  }
  return v / 2;
}

Result<int> quarter(int v) {
  BAGUA_ASSIGN_OR_RETURN(int h, half(v));
  BAGUA_ASSIGN_OR_RETURN(int q, half(h));
  return q;
}

TEST(Status, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.isOk());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.toString(), "Ok");
}

TEST(Status, CarriesCodeMessageAndOrigin) {
  Status s = BAGUA_ERROR(kRemoteError, "peer %s closed after %d bytes", "10.0.0.1:5000", 42);
  EXPECT_FALSE(s.isOk());
  EXPECT_EQ(s.code(), StatusCode::kRemoteError);
  EXPECT_EQ(s.message(), "peer 10.0.0.1:5000 closed after 42 bytes");
  EXPECT_NE(s.origin().find("status_test.cc:"), std::string::npos);
  EXPECT_NE(s.toString().find("RemoteError: peer 10.0.0.1:5000"), std::string::npos);
}

TEST(Status, ReturnIfErrorAddsAFrame) {
  Status s = propagates(StatusCode::kSystemError);
  EXPECT_EQ(s.code(), StatusCode::kSystemError);
  EXPECT_EQ(s.message(), "inner failure");
  EXPECT_NE(s.toString().find("[inner.cc:7] <- status_test.cc:"), std::string::npos)
      << s.toString();
}

TEST(Status, WithContextPrefixesMessage) {
  Status s = failsWith(StatusCode::kInternal);
  s.withContext("bucket 3");
  EXPECT_EQ(s.message(), "bucket 3: inner failure");
}

TEST(Result, ValueAndError) {
  Result<int> ok = quarter(8);
  ASSERT_TRUE(ok.isOk());
  EXPECT_EQ(*ok, 2);
  Result<int> bad = quarter(6);  // 6 -> 3 -> odd
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "3 is odd");
  EXPECT_EQ(bad.valueOr(-1), -1);
}

TEST(Result, OkStatusIsTurnedIntoInternalError) {
  Result<int> r{Status::ok()};
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

TEST(Status, ErrnoMapping) {
  EXPECT_EQ(errnoStatus(ECONNRESET, "recv").code(), StatusCode::kRemoteError);
  EXPECT_EQ(errnoStatus(EPIPE, "send").code(), StatusCode::kRemoteError);
  EXPECT_EQ(errnoStatus(EAGAIN, "send").code(), StatusCode::kUnavailable);
  EXPECT_EQ(errnoStatus(ETIMEDOUT, "connect").code(), StatusCode::kDeadlineExceeded);
  Status s = errnoStatus(EACCES, "open /x");
  EXPECT_EQ(s.code(), StatusCode::kSystemError);
  EXPECT_NE(s.message().find("open /x: Permission denied (errno 13)"), std::string::npos)
      << s.message();
}

TEST(Status, StrPrintfHandlesLongStrings) {
  std::string big(1000, 'x');
  EXPECT_EQ(strPrintf("<%s>", big.c_str()).size(), 1002u);
}

TEST(StatusDeathTest, AssertAbortsWithMessage) {
  EXPECT_DEATH(BAGUA_ASSERT(1 + 1 == 3, "math is %s", "broken"), "math is broken");
}

}  // namespace
}  // namespace bagua
