#include "bagua/base/params.h"
#include "bagua/base/logging.h"

#include <gtest/gtest.h>

namespace bagua {
namespace {

// --- Parsers --------------------------------------------------------------------------------

TEST(ParseBool, AcceptsTheDocumentedSpellings) {
  for (const char* t : {"1", "true", "TRUE", "Yes", "on"}) {
    ASSERT_TRUE(parseBool(t).isOk()) << t;
    EXPECT_TRUE(*parseBool(t)) << t;
  }
  for (const char* t : {"0", "false", "No", "OFF"}) {
    ASSERT_TRUE(parseBool(t).isOk()) << t;
    EXPECT_FALSE(*parseBool(t)) << t;
  }
}

TEST(ParseBool, RejectsAnythingElse) {
  for (const char* t : {"", "2", "y", "truee", " true", "-1"}) {
    EXPECT_FALSE(parseBool(t).isOk()) << "'" << t << "'";
  }
}

TEST(ParseInt, AcceptsWholeIntegers) {
  EXPECT_EQ(*parseInt("0"), 0);
  EXPECT_EQ(*parseInt("-17"), -17);
  EXPECT_EQ(*parseInt("+5"), 5);
  EXPECT_EQ(*parseInt("0x10"), 16);
  EXPECT_EQ(*parseInt("9223372036854775807"), INT64_MAX);
}

TEST(ParseInt, RejectsPartialAndOverflowingInput) {
  for (const char* t : {"", "12abc", "1.5", " 3", "3 ", "9223372036854775808", "010", "abc"}) {
    EXPECT_FALSE(parseInt(t).isOk()) << "'" << t << "'";
  }
}

TEST(ParseDouble, AcceptsAndRejects) {
  EXPECT_DOUBLE_EQ(*parseDouble("0.25"), 0.25);
  EXPECT_DOUBLE_EQ(*parseDouble("-1e3"), -1000.0);
  for (const char* t : {"", "nan", "inf", "1.0x", "1e999"}) {
    EXPECT_FALSE(parseDouble(t).isOk()) << "'" << t << "'";
  }
}

TEST(ParseBytes, SuffixesArePowersOf1024) {
  EXPECT_EQ(*parseBytes("4096"), 4096u);
  EXPECT_EQ(*parseBytes("64K"), 64u << 10);
  EXPECT_EQ(*parseBytes("1m"), 1u << 20);
  EXPECT_EQ(*parseBytes("2MiB"), 2u << 20);
  EXPECT_EQ(*parseBytes("3GB"), uint64_t{3} << 30);
  EXPECT_EQ(*parseBytes("1T"), uint64_t{1} << 40);
}

TEST(ParseBytes, RejectsNegativesFractionsAndUnknownSuffixes) {
  for (const char* t :
       {"", "-1", "1.5M", "12X", "M", "1 M", "99999999999999999999", "17179869184T"}) {
    EXPECT_FALSE(parseBytes(t).isOk()) << "'" << t << "'";
  }
}

TEST(FormatBytes, ExactUnitsOnly) {
  EXPECT_EQ(formatBytes(1 << 20), "1 MiB");
  EXPECT_EQ(formatBytes(65536), "64 KiB");
  EXPECT_EQ(formatBytes(1000), "1000");
  EXPECT_EQ(formatBytes(0), "0");
}

// --- Catalogue ------------------------------------------------------------------------------

// A catalogue in the one idiom every library uses: a struct whose members are its knobs.
struct TestParams : ParamCatalogue {
  TestParams() : ParamCatalogue("test", "knobs of the catalogue tests") {}

  BoolParam flag{*this, "T_FLAG", false, "a flag"};
  IntParam streams{*this, "T_STREAMS", 2, {1, 64}, "streams"};
  DoubleParam ratio{*this, "T_RATIO", 0.5, {0.0, 1.0}, "ratio"};
  BytesParam chunk{*this, "T_CHUNK", 1 << 20, {4096, uint64_t{1} << 30}, "chunk"};
  StringParam name{*this, "T_NAME", "eth", "iface"};
  EnumParam mode{*this, "T_MODE", "basic", {{"basic", "threads"}, {"tokio", "async"}}, "mode"};
};

class CatalogueTest : public ::testing::Test {
 protected:
  TestParams c_;
  BoolParam& flag_ = c_.flag;
  IntParam& streams_ = c_.streams;
  DoubleParam& ratio_ = c_.ratio;
  BytesParam& chunk_ = c_.chunk;
  StringParam& name_ = c_.name;
  EnumParam& mode_ = c_.mode;
};

TEST_F(CatalogueTest, DefaultsWhenTheEnvironmentIsEmpty) {
  ScopedEnvForTesting env(c_, {});
  ASSERT_TRUE(c_.loadAll().isOk());
  EXPECT_FALSE(*flag_.get());
  EXPECT_EQ(*streams_.get(), 2);
  EXPECT_DOUBLE_EQ(*ratio_.get(), 0.5);
  EXPECT_EQ(*chunk_.get(), 1u << 20);
  EXPECT_EQ(*name_.get(), "eth");
  EXPECT_EQ(*mode_.get(), "basic");
  EXPECT_EQ(streams_.source(), ParamSource::kDefault);
}

TEST_F(CatalogueTest, EnvironmentValuesOfEveryType) {
  ScopedEnvForTesting env(c_, {{"T_FLAG", "yes"},
                               {"T_STREAMS", "8"},
                               {"T_RATIO", "0.75"},
                               {"T_CHUNK", "256K"},
                               {"T_NAME", "^docker,lo"},
                               {"T_MODE", "TOKIO"}});
  ASSERT_TRUE(c_.loadAll().isOk());
  EXPECT_TRUE(*flag_.get());
  EXPECT_EQ(*streams_.get(), 8);
  EXPECT_DOUBLE_EQ(*ratio_.get(), 0.75);
  EXPECT_EQ(*chunk_.get(), 256u << 10);
  EXPECT_EQ(*name_.get(), "^docker,lo");
  EXPECT_EQ(*mode_.get(), "tokio");  // stored in the choice's spelling
  EXPECT_EQ(streams_.source(), ParamSource::kEnvironment);
  EXPECT_EQ(*chunk_.valueString(), "256 KiB");
}

struct BadValue {
  const char* key;
  const char* value;
  const char* acceptedFragment;
};

class CatalogueRejects : public CatalogueTest, public ::testing::WithParamInterface<BadValue> {};

TEST_P(CatalogueRejects, NamesKeyValueAndAcceptedValues) {
  const BadValue& b = GetParam();
  ScopedEnvForTesting env(c_, {{b.key, b.value}});
  Status s = c_.loadAll();
  ASSERT_FALSE(s.isOk());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(std::string(b.key) + "='" + b.value + "'"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find(b.acceptedFragment), std::string::npos) << s.message();
  // The parameter keeps failing; it does not fall back to the default silently.
  ParamBase* p = c_.find(b.key);
  ASSERT_NE(p, nullptr);
  EXPECT_FALSE(p->valueString().isOk());
}

INSTANTIATE_TEST_SUITE_P(
    EveryType, CatalogueRejects,
    ::testing::Values(BadValue{"T_FLAG", "maybe", "true/false"},
                      BadValue{"T_STREAMS", "0", "an integer in [1, 64]"},
                      BadValue{"T_STREAMS", "65", "an integer in [1, 64]"},
                      BadValue{"T_STREAMS", "four", "an integer in [1, 64]"},
                      BadValue{"T_RATIO", "1.5", "a number in [0, 1]"},
                      BadValue{"T_CHUNK", "1K", "a byte size in [4 KiB, 1 GiB]"},
                      BadValue{"T_CHUNK", "-4K", "a byte size"},
                      BadValue{"T_MODE", "fast", "one of basic (threads), tokio (async)"}));

TEST_F(CatalogueTest, ApiOverrideBeatsEnvironment) {
  ScopedEnvForTesting env(c_, {{"T_STREAMS", "8"}});
  ASSERT_TRUE(streams_.setOverride(4).isOk());
  EXPECT_EQ(*streams_.get(), 4);
  EXPECT_EQ(streams_.source(), ParamSource::kApi);
}

TEST_F(CatalogueTest, ApiOverrideIsValidated) {
  ScopedEnvForTesting env(c_, {});
  Status s = streams_.setOverride(100);
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("T_STREAMS='100'"), std::string::npos) << s.message();
}

TEST_F(CatalogueTest, ValuesAreFrozenAfterFirstRead) {
  ScopedEnvForTesting env(c_, {});
  EXPECT_EQ(*streams_.get(), 2);
  Status s = streams_.setOverride(4);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(*streams_.get(), 2);
}

TEST_F(CatalogueTest, StringValidatorIsApplied) {
  StringParam even{c_,
                   "T_EVEN",
                   "aa",
                   "even-length string",
                   "a string of even length",
                   [](const std::string& v) -> Status {
                     return v.size() % 2 == 0 ? Status::ok()
                                              : BAGUA_ERROR(kInvalidArgument, "odd length");
                   }};
  ScopedEnvForTesting env(c_, {{"T_EVEN", "abc"}});
  Result<std::string> r = even.get();
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("a string of even length"), std::string::npos);
}

TEST_F(CatalogueTest, FindAndListing) {
  EXPECT_EQ(c_.params().size(), 6u);
  EXPECT_EQ(c_.find("T_MODE"), &mode_);
  EXPECT_EQ(c_.find("NOPE"), nullptr);
  EXPECT_EQ(mode_.type(), ParamType::kEnum);
  EXPECT_EQ(chunk_.defaultString(), "1 MiB");
}

TEST_F(CatalogueTest, MembersRegisterInDeclarationOrder) {
  std::vector<std::string> keys;
  for (const ParamBase* p : c_.params()) {
    keys.push_back(p->key());
    EXPECT_EQ(&p->catalogue(), &c_);
  }
  EXPECT_EQ(keys, (std::vector<std::string>{"T_FLAG", "T_STREAMS", "T_RATIO", "T_CHUNK", "T_NAME",
                                            "T_MODE"}));
}

TEST(CatalogueDeathTest, AKeyDeclaredTwiceIsAProgrammingError) {
  struct Twice : ParamCatalogue {
    Twice() : ParamCatalogue("twice", "") {}
    IntParam a{*this, "T_SAME", 1, {0, 2}, "first"};
    IntParam b{*this, "T_SAME", 1, {0, 2}, "second"};
  };
  EXPECT_DEATH({ Twice t; }, "T_SAME declared twice");
}

TEST(BaseParams, DeclaresTheLoggingKnobs) {
  BaseParams& c = baseParams();
  EXPECT_EQ(c.find("BAGUA_LOG_LEVEL"), &c.logLevel);
  EXPECT_EQ(c.find("BAGUA_LOG_SUBSYS"), &c.logSubsys);
  EXPECT_EQ(c.find("BAGUA_LOG_FILE"), &c.logFile);
}

}  // namespace
}  // namespace bagua
