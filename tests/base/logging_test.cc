#include "bagua/base/logging.h"

#include <vector>

#include <gtest/gtest.h>

#include "bagua/base/params.h"

namespace bagua {
namespace {

// Categories as a client library declares them (base knows none of its clients').
const LogCategory kLogNet{"net"};
const LogCategory kLogCore{"core"};
const LogCategory kLogCache{"cache"};
const LogCategory kLogLoader{"loader"};

struct Captured {
  LogLevel level;
  int category;
  std::string message;
};

class LoggingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setLogSink([this](LogLevel l, const LogCategory& c, const char*, int, const std::string& m) {
      lines_.push_back({l, c.id(), m});
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
  BAGUA_LOG_DEBUG(kLogNet, "hidden %d", 1);
  BAGUA_LOG_INFO(kLogNet, "shown %d", 2);
  BAGUA_LOG_WARN(kLogCore, "shown %s", "too");
  ASSERT_EQ(lines_.size(), 2u);
  EXPECT_EQ(lines_[0].message, "shown 2");
  EXPECT_EQ(lines_[0].level, LogLevel::kInfo);
  EXPECT_EQ(lines_[1].category, kLogCore.id());
}

TEST_F(LoggingTest, FilteredBeforeFormatting) {
  ScopedEnvForTesting env(baseParams(), {{"BAGUA_LOG_LEVEL", "error"}});
  ASSERT_TRUE(configureLogging().isOk());
  formatted = 0;
  BAGUA_LOG_INFO(kLogNet, "value %d", countFormat());
  EXPECT_EQ(formatted, 0) << "arguments were evaluated for a filtered message";
  BAGUA_LOG_ERROR(kLogNet, "value %d", countFormat());
  EXPECT_EQ(formatted, 1);
}

TEST_F(LoggingTest, PerCategoryThresholds) {
  ScopedEnvForTesting env(
      baseParams(), {{"BAGUA_LOG_LEVEL", "warn"}, {"BAGUA_LOG_SUBSYS", "net:debug,cache:off"}});
  ASSERT_TRUE(configureLogging().isOk());
  EXPECT_TRUE(logEnabled(LogLevel::kDebug, kLogNet));
  EXPECT_FALSE(logEnabled(LogLevel::kInfo, kLogCore));
  EXPECT_TRUE(logEnabled(LogLevel::kWarn, kLogCore));
  EXPECT_FALSE(logEnabled(LogLevel::kError, kLogCache));
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
  setLogLevel(kLogLoader, LogLevel::kTrace);
  EXPECT_FALSE(logEnabled(LogLevel::kError, kLogNet));
  EXPECT_TRUE(logEnabled(LogLevel::kDebug, kLogLoader));
}

TEST_F(LoggingTest, AnUnknownCategoryErrorListsTheRegisteredOnes) {
  ScopedEnvForTesting env(baseParams(), {{"BAGUA_LOG_SUBSYS", "nett:debug"}});
  Status s = configureLogging();
  ASSERT_FALSE(s.isOk());
  for (const char* name : {"init", "env", "net", "core", "cache", "loader"}) {
    EXPECT_NE(s.message().find(name), std::string::npos) << name << " in " << s.message();
  }
}

TEST_F(LoggingTest, ACategoryRegisteredAfterConfigurationGetsItsThreshold) {
  ScopedEnvForTesting env(baseParams(), {{"BAGUA_LOG_LEVEL", "error"},
                                         {"BAGUA_LOG_SUBSYS", "net:debug,all:warn,core:info"}});
  ASSERT_TRUE(configureLogging().isOk());
  // Later pairs win: all:warn overrides net:debug, core:info overrides all:warn.
  EXPECT_FALSE(logEnabled(LogLevel::kInfo, kLogNet));
  EXPECT_TRUE(logEnabled(LogLevel::kWarn, kLogNet));
  EXPECT_TRUE(logEnabled(LogLevel::kInfo, kLogCore));
  const LogCategory late("late_registered");
  EXPECT_FALSE(logEnabled(LogLevel::kInfo, late));
  EXPECT_TRUE(logEnabled(LogLevel::kWarn, late));
}

TEST(LoggingNames, Stable) {
  EXPECT_STREQ(logLevelName(LogLevel::kWarn), "warn");
  const LogCategory again("cache");  // a second declaration of a name shares its slot
  EXPECT_EQ(again.id(), kLogCache.id());
  EXPECT_STREQ(again.name(), "cache");
  EXPECT_STREQ(kLogInit.name(), "init");
  EXPECT_STREQ(kLogEnv.name(), "env");
}

}  // namespace
}  // namespace bagua
