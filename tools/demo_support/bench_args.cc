#include "bagua/demo_support/bench_args.h"

#include <cstdio>
#include <string>

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

int parseBenchArg(const char* tool, int argc, char** argv, int* i, BenchArgs* a) {
  const std::string k = argv[*i];
  if (*i + 1 >= argc || (k != "--sizes" && k != "--iters" && k != "--reps")) {
    return 0;
  }
  const char* v = argv[++*i];
  if (k == "--sizes") {
    Result<std::vector<size_t>> sizes = parseByteList(v, 4);
    if (!sizes.isOk()) {
      std::fprintf(stderr, "%s: %s\n", tool, sizes.status().message().c_str());
      return -1;
    }
    a->sizes = *sizes;
    return 1;
  }
  Result<int64_t> n = parseInt(v);
  if (!n.isOk() || *n < 1 || *n > 100000) {
    std::fprintf(stderr, "%s: %s must be a positive integer\n", tool, k.c_str());
    return -1;
  }
  (k == "--iters" ? a->iters : a->reps) = static_cast<int>(*n);
  return 1;
}

}  // namespace bagua::demo
