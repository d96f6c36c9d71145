#include "bagua/loader/progress.h"

#include <cstdio>
#include <string>

#include <gtest/gtest.h>

namespace bagua::loader {
namespace {

std::string readAll(FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string text;
  char buf[512];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) {
    text.append(buf, n);
  }
  return text;
}

size_t countOf(const std::string& s, char c) {
  size_t n = 0;
  for (char x : s) {
    n += x == c ? 1 : 0;
  }
  return n;
}

TEST(FormatDuration, HoursMinutesSeconds) {
  EXPECT_EQ(formatDuration(0), "00:00:00");
  EXPECT_EQ(formatDuration(59.6), "00:01:00");
  EXPECT_EQ(formatDuration(3725), "01:02:05");
  EXPECT_EQ(formatDuration(-1), "--:--:--");
  EXPECT_EQ(formatDuration(1.0 / 0.0), "--:--:--");
}

TEST(ProgressMeter, RateAndEtaFollowTheClock) {
  double t = 100.0;
  ProgressOptions o;
  o.mode = ProgressOptions::Mode::kLines;
  o.clock = [&t] { return t; };
  ProgressMeter m(nullptr, "epoch 0", 1000, o);
  t = 110.0;
  m.add(250);
  EXPECT_DOUBLE_EQ(m.rate(), 25.0);
  EXPECT_EQ(m.line(),
            "epoch 0  250/1000 samples   25.0%  25.0 samples/s  elapsed 00:00:10  ETA 00:00:30");
}

TEST(ProgressMeter, NonTtyPrintsALineEveryInterval) {
  double t = 0;
  ProgressOptions o;
  o.mode = ProgressOptions::Mode::kLines;
  o.lineIntervalSeconds = 5;
  o.clock = [&t] { return t; };
  FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressMeter m(f, "x", 100, o);
    for (int i = 0; i < 100; ++i) {
      t += 0.5;  // 50 s in all: a line at 5, 10, ..., 50 s, then the final line
      m.add(1);
    }
    m.finish();
    m.finish();  // idempotent
  }
  std::string text = readAll(f);
  std::fclose(f);
  EXPECT_EQ(countOf(text, '\n'), 11u) << text;
  EXPECT_EQ(countOf(text, '\r'), 0u);
  EXPECT_NE(text.find("100/100 samples  100.0%"), std::string::npos);
  EXPECT_NE(text.find("ETA 00:00:00"), std::string::npos);
}

TEST(ProgressMeter, TtyRewritesOneLine) {
  double t = 0;
  ProgressOptions o;
  o.mode = ProgressOptions::Mode::kTty;
  o.ttyIntervalSeconds = 1;
  o.unit = "batches";
  o.clock = [&t] { return t; };
  FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressMeter m(f, "", 0, o);  // unknown total: no ETA
    EXPECT_TRUE(m.isTty());
    for (int i = 0; i < 10; ++i) {
      t += 1;
      m.add(3);
    }
  }  // the destructor finishes
  std::string text = readAll(f);
  std::fclose(f);
  EXPECT_EQ(countOf(text, '\r'), 11u) << text;
  EXPECT_EQ(countOf(text, '\n'), 1u);
  EXPECT_EQ(text.find("ETA"), std::string::npos);
  EXPECT_NE(text.find("30 batches  3.0 batches/s"), std::string::npos) << text;
}

TEST(ProgressMeter, AutoModeOnAFileIsLines) {
  FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  ProgressMeter m(f, "x", 10, {});
  EXPECT_FALSE(m.isTty());
  m.finish();
  std::fclose(f);
}

}  // namespace
}  // namespace bagua::loader
