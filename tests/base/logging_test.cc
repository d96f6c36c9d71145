#include "bagua/base/logging.h"

#include <vector>

#include <gtest/gtest.h>

#include "bagua/base/params.h"

namespace bagua {
namespace {

struct Captured {
  LogLevel level;
  LogCategory category;
  std::string message;
};

class LoggingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setLogSink([this](LogLevel l, LogCategory c, const char*, int, const std::string& m) {
      lines_.push_back({l, c, m});
    });
  }
  void TearDown() override {
    setLogSink(nullptr);
    baseParams().setEnvLookupForTesting(nullptr);
    configureLogging().ignore();
  }
  std::vector<Captured> lines_;
};

int formatted = 0;
int countFormat() {
  ++formatted;
  return formatted;
}

TEST_F(LoggingTest, LevelThresholdFromEnvironment) {
  ScopedEnvForTesting env(baseParams(), {{"BAGUA_LOG_LEVEL", "info"}});
  ASSERT_TRUE(configureLogging().isOk());
  BAGUA_LOG_DEBUG(kNet, "hidden %d", 1);
  BAGUA_LOG_INFO(kNet, "shown %d", 2);
  BAGUA_LOG_WARN(kCore, "shown %s", "too");
  ASSERT_EQ(lines_.size(), 2u);
  EXPECT_EQ(lines_[0].message, "shown 2");
  EXPECT_EQ(lines_[0].level, LogLevel::kInfo);
  EXPECT_EQ(lines_[1].category, LogCategory::kCore);
}

TEST_F(LoggingTest, FilteredBeforeFormatting) {
  ScopedEnvForTesting env(baseParams(), {{"BAGUA_LOG_LEVEL", "error"}});
  ASSERT_TRUE(configureLogging().isOk());
  formatted = 0;
  BAGUA_LOG_INFO(kNet, "value %d", countFormat());
  EXPECT_EQ(formatted, 0) << "arguments were evaluated for a filtered message";
  BAGUA_LOG_ERROR(kNet, "value %d", countFormat());
  EXPECT_EQ(formatted, 1);
}

TEST_F(LoggingTest, PerCategoryThresholds) {
  ScopedEnvForTesting env(
      baseParams(), {{"BAGUA_LOG_LEVEL", "warn"}, {"BAGUA_LOG_SUBSYS", "net:debug,cache:off"}});
  ASSERT_TRUE(configureLogging().isOk());
  EXPECT_TRUE(logEnabled(LogLevel::kDebug, LogCategory::kNet));
  EXPECT_FALSE(logEnabled(LogLevel::kInfo, LogCategory::kCore));
  EXPECT_TRUE(logEnabled(LogLevel::kWarn, LogCategory::kCore));
  EXPECT_FALSE(logEnabled(LogLevel::kError, LogCategory::kCache));
}

TEST_F(LoggingTest, BadSubsysIsAnErrorNamingTheKey) {
  ScopedEnvForTesting env(baseParams(), {{"BAGUA_LOG_SUBSYS", "nett:debug"}});
  Status s = configureLogging();
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("BAGUA_LOG_SUBSYS='nett:debug'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("unknown category 'nett'"), std::string::npos) << s.message();
}

TEST_F(LoggingTest, BadLevelIsAnErrorListingTheLevels) {
  ScopedEnvForTesting env(baseParams(), {{"BAGUA_LOG_LEVEL", "verbose"}});
  Status s = configureLogging();
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("one of trace"), std::string::npos) << s.message();
}

TEST_F(LoggingTest, ProgrammaticLevel) {
  setLogLevel(LogLevel::kOff);
  setLogLevel(LogCategory::kLoader, LogLevel::kTrace);
  EXPECT_FALSE(logEnabled(LogLevel::kError, LogCategory::kNet));
  EXPECT_TRUE(logEnabled(LogLevel::kDebug, LogCategory::kLoader));
}

TEST(LoggingNames, Stable) {
  EXPECT_STREQ(logLevelName(LogLevel::kWarn), "warn");
  EXPECT_STREQ(logCategoryName(LogCategory::kBucket), "bucket");
}

}  // namespace
}  // namespace bagua
