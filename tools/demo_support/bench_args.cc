#include "bagua/demo_support/bench_args.h"

#include <string>

#include <CLI/CLI.hpp>

#include "bagua/base/params.h"

namespace bagua::demo {

Result<std::vector<size_t>> parseByteList(std::string_view text, uint64_t min) {
  std::vector<size_t> out;
  size_t pos = 0;
  while (true) {
    const size_t comma = text.find(',', pos);
    const std::string_view item =
        text.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
    Result<uint64_t> b = parseBytes(item);
    if (!b.isOk() || *b < min) {
      return BAGUA_ERROR(kInvalidArgument, "bad size '%s'", std::string(item).c_str());
    }
    out.push_back(*b);
    if (comma == std::string_view::npos) {
      return out;
    }
    pos = comma + 1;
  }
}

void addBenchOptions(CLI::App& app, BenchArgs* a) {
  app.add_option_function<std::string>(
         "--sizes",
         [a](const std::string& v) {
           a->sizes = *parseByteList(v, 4);  // the check below has accepted it
         },
         "message sizes in bytes, comma-separated (4K,1M,64M; each at least 4)")
      ->type_name("LIST")
      ->check(CLI::Validator(
          [](std::string& v) {
            Result<std::vector<size_t>> sizes = parseByteList(v, 4);
            return sizes.isOk() ? std::string() : sizes.status().message();
          },
          "LIST"));
  app.add_option("--iters", a->iters, "timed iterations of each measurement")
      ->check(CLI::Range(1, 100000));
  app.add_option("--reps", a->reps, "repetitions of each measurement")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
}

}  // namespace bagua::demo
