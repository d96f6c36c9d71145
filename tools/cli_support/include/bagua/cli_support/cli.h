// The command-line conventions every bagua tool shares, on CLI11:
//   - `--help` (usage on stdout, exit 0) and `--version` ("<tool> <project version>", exit 0);
//   - a usage error (unknown option, bad or missing value, a check of the tool's own) is one line
//     on stderr, "<tool>: <what is wrong> (see <tool> --help)", and exit status 2 (kExitUsage);
//     a failure while running is exit status 1 (kExitFailure), the reason on stderr;
//   - `--key value` and `--key=value`; a name of several words answers to both spellings,
//     `--flag_name` (Bagua's) and `--flag-name` (torchrun's), through flagNames();
//   - an option given twice keeps its last value.
// Any thread (a tool parses on its main thread before starting any other).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace bagua::cli {

inline constexpr int kExitUsage = 2;
inline constexpr int kExitFailure = 1;

// Sets the shared conventions on `app` (named after the tool: CLI::App{description, "tool"}):
// --version, the help formatting, last value wins.
void configure(CLI::App& app);

// "nproc_per_node" -> "--nproc_per_node,--nproc-per-node"; "iters" -> "--iters". `extra` (e.g.
// "-x" or an old name) is appended as given.
std::string flagNames(std::string_view name, std::string_view extra = {});

// An option holding a byte size as bagua::parseBytes reads it ("32M", "4K", "1048576"), at
// least `min`; a bad one is a usage error naming the option and the value.
CLI::Option* addBytes(CLI::App& app, const std::string& names, uint64_t* out, uint64_t min,
                      const std::string& help);

// Parses argv. nullopt: go on and run. Else the exit status main returns now: 0 after --help or
// --version (printed on stdout), kExitUsage after a usage error (on stderr, as above).
std::optional<int> parse(CLI::App& app, int argc, char** argv);

// A usage error the tool finds itself after parsing (a value out of its range, options that do
// not go together): "<tool>: <what> (see <tool> --help)" on stderr; returns kExitUsage.
int usageError(const CLI::App& app, std::string_view what);
int usageError(std::string_view tool, std::string_view what);

// The project version (meson.build's), as --version prints it.
const char* version();

}  // namespace bagua::cli
