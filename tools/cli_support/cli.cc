#include "bagua/cli_support/cli.h"

#include <cstdio>

#include "bagua/base/params.h"
#include "bagua_config.h"

namespace bagua::cli {

void configure(CLI::App& app) {
  app.set_version_flag("--version", app.get_name() + " " + BAGUA_VERSION,
                       "print the tool's name and bagua's version, and exit");
  app.set_help_flag("-h,--help", "print this help and exit");
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.get_formatter()->column_width(36);
}

std::string flagNames(std::string_view name, std::string_view extra) {
  std::string out = "--" + std::string(name);
  if (name.find('_') != std::string_view::npos) {
    std::string dashed(name);
    for (char& c : dashed) {
      c = c == '_' ? '-' : c;
    }
    out += ",--" + dashed;
  }
  if (!extra.empty()) {
    out += "," + std::string(extra);
  }
  return out;
}

CLI::Option* addBytes(CLI::App& app, const std::string& names, uint64_t* out, uint64_t min,
                      const std::string& help) {
  return app
      .add_option_function<std::string>(
          names, [out](const std::string& v) { *out = *parseBytes(v); }, help)
      ->type_name("BYTES")
      ->default_str(std::to_string(*out))
      ->check(CLI::Validator(
          [min](std::string& v) {
            Result<uint64_t> b = parseBytes(v);
            if (!b.isOk() || *b < min) {
              return "want a byte size of at least " + std::to_string(min) +
                     " (e.g. 4K, 32M), got '" + v + "'";
            }
            return std::string();
          },
          "BYTES"));
}

std::optional<int> parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::fputs(app.help("", CLI::AppFormatMode::All).c_str(), stdout);
    return 0;
  } catch (const CLI::CallForVersion& e) {
    std::printf("%s\n", e.what());
    return 0;
  } catch (const CLI::ParseError& e) {
    return usageError(app, e.what());
  }
  return std::nullopt;
}

int usageError(std::string_view tool, std::string_view what) {
  // One line, whatever CLI11's message holds.
  std::string line(what);
  for (char& c : line) {
    c = c == '\n' ? ' ' : c;
  }
  std::fprintf(stderr, "%.*s: %s (see %.*s --help)\n", static_cast<int>(tool.size()), tool.data(),
               line.c_str(), static_cast<int>(tool.size()), tool.data());
  return kExitUsage;
}

int usageError(const CLI::App& app, std::string_view what) {
  return usageError(app.get_name(), what);
}

const char* version() {
  return BAGUA_VERSION;
}

}  // namespace bagua::cli
