#include "setting_codec.h"

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "bagua/base/params.h"

namespace bagua::autotune {

namespace {

std::vector<std::string> splitLines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  std::string line;
  while (std::getline(in, line)) {
    out.push_back(line);
  }
  return out;
}

}  // namespace

std::string encodeSetting(const Setting& s) {
  std::string out =
      strPrintf("bucket_bytes=%llu\n", static_cast<unsigned long long>(s.bucketBytes));
  for (const auto& [name, v] : s.knobs) {
    out += strPrintf("knob.%s=%lld\n", name.c_str(), static_cast<long long>(v));
  }
  for (const auto& b : s.buckets) {
    out += "bucket=";
    for (size_t i = 0; i < b.size(); ++i) {
      out += (i ? "," : "") + b[i];
    }
    out += "\n";
  }
  return out;
}

Result<Setting> decodeSetting(const std::string& text, const std::string& where) {
  const std::vector<std::string> lines = splitLines(text);
  Setting s;
  bool haveBytes = false;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    if (line.empty() || line[0] == '#') {
      continue;
    }
    const size_t eq = line.find('=');
    if (eq == std::string::npos) {
      return BAGUA_ERROR(kInvalidArgument, "%s line %zu: expected key=value, got '%s'",
                         where.c_str(), i + 1, line.c_str());
    }
    const std::string k = line.substr(0, eq);
    const std::string v = line.substr(eq + 1);
    if (k == "bucket_bytes") {
      BAGUA_ASSIGN_OR_RETURN(int64_t b, parseInt(v));
      if (b <= 0) {
        return BAGUA_ERROR(kInvalidArgument, "%s: bucket_bytes %lld must be positive",
                           where.c_str(), static_cast<long long>(b));
      }
      s.bucketBytes = static_cast<uint64_t>(b);
      haveBytes = true;
    } else if (k.rfind("knob.", 0) == 0) {
      BAGUA_ASSIGN_OR_RETURN(int64_t kv, parseInt(v));
      s.knobs[k.substr(5)] = kv;
    } else if (k == "bucket") {
      std::vector<std::string> names;
      std::string cur;
      std::istringstream in(v);
      while (std::getline(in, cur, ',')) {
        names.push_back(cur);
      }
      if (names.empty()) {
        return BAGUA_ERROR(kInvalidArgument, "%s line %zu: empty bucket", where.c_str(), i + 1);
      }
      s.buckets.push_back(std::move(names));
    } else if (k == "score") {
      BAGUA_ASSIGN_OR_RETURN(s.score, parseDouble(v));
    } else if (k == "model") {
      // Informational.
    } else {
      return BAGUA_ERROR(kInvalidArgument, "%s line %zu: unknown key '%s'", where.c_str(), i + 1,
                         k.c_str());
    }
  }
  if (!haveBytes || s.buckets.empty()) {
    return BAGUA_ERROR(kInvalidArgument, "%s: needs bucket_bytes= and at least one bucket= line",
                       where.c_str());
  }
  return s;
}

Status saveSetting(const std::string& path, const std::string& model, const Setting& setting) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) {
      return BAGUA_ERRNO(errno, "autotune: cannot write " + tmp);
    }
    out << "# bagua autotune: best setting found; start a later run from it with "
           "BAGUA_AUTOTUNE_LOAD_FILE\n";
    out << "model=" << model << "\n"
        << strPrintf("score=%.17g\n", setting.score) << encodeSetting(setting);
    if (!out.flush()) {
      return BAGUA_ERRNO(errno, "autotune: writing " + tmp);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return BAGUA_ERRNO(errno, "autotune: rename " + tmp + " -> " + path);
  }
  return Status::ok();
}

Result<Setting> loadSetting(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return BAGUA_ERRNO(errno, "autotune: cannot read the saved setting " + path);
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return decodeSetting(ss.str(), path);
}

}  // namespace bagua::autotune
