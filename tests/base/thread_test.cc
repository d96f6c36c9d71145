#include "bagua/base/thread.h"

#include <thread>

#include <gtest/gtest.h>

namespace bagua {
namespace {

TEST(Thread, NameIsSetAndTruncatedForTheKernel) {
  std::string seen;
  std::string kernel;
  std::thread t([&] {
    setThreadName("bagua-a-very-long-thread-name");
    seen = threadName();
    char buf[16] = {};
    pthread_getname_np(pthread_self(), buf, sizeof(buf));
    kernel = buf;
  });
  t.join();
  EXPECT_EQ(seen, "bagua-a-very-long-thread-name");
  EXPECT_EQ(kernel, "bagua-a-very-lo");
}

TEST(Thread, IdsDifferAcrossThreads) {
  int mine = threadId();
  int other = 0;
  std::thread t([&] { other = threadId(); });
  t.join();
  EXPECT_GT(mine, 0);
  EXPECT_NE(mine, other);
}

}  // namespace
}  // namespace bagua
