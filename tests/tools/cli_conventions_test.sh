#!/usr/bin/env bash
# The command-line conventions every installed tool shares (tools/cli_support, tools/README.md
# "Command lines"), checked on every tool this build installs and on the SDK example's
# bagua-cpp-trainer:
#   --help          exit 0, nothing on stderr, a "Usage: TOOL ..." line, --help and --version named
#   --version       exit 0, nothing on stderr, stdout exactly "TOOL VERSION" (meson.build's)
#   --no-such-flag  exit 2, nothing on stdout, one line on stderr:
#                   "TOOL: ... --no-such-flag ... (see TOOL --help)"
#   NUMERIC abc     exit 2, the same one line, naming the flag and the value (a tool without a
#                   numeric flag, bagua-params, is said to have none)
# The tools come from the build: each tools/<tool>/meson.build adds its executable and one numeric
# flag to `bagua_tools`, and the build's own list of targets (meson-info/intro-targets.json) must
# hold no installed executable from tools/ that is missing here, so a new tool cannot be left out.
# usage: cli_conventions_test.sh PYTHON BUILD_ROOT SOURCE_ROOT VERSION TOOL FLAG [TOOL FLAG]...
#   (FLAG: one numeric flag of TOOL, or '' for none)
set -uo pipefail
python="$1"; build_root="$2"; source_root="$3"; version="$4"; shift 4
out="$(mktemp)"; err="$(mktemp)"
trap 'rm -f "$out" "$err"' EXIT
failures=0
fail() {
  echo "FAIL: $*"
  sed 's/^/  | /' "$out" "$err" | tail -12
  failures=$((failures + 1))
}
# One usage-error line naming every word given: "NAME: ...WORDS... (see NAME --help)".
usage_error() {
  local name="$1" what="$2"; shift 2
  [ "$rc" -eq 2 ] || { fail "$name $what: exit status $rc, want 2"; return; }
  [ ! -s "$out" ] || { fail "$name $what: printed on stdout"; return; }
  [ "$(wc -l <"$err")" -eq 1 ] || { fail "$name $what: want one line on stderr"; return; }
  local line; line="$(cat "$err")"
  [[ "$line" == "$name: "*" (see $name --help)" ]] ||
    { fail "$name $what: stderr is not '$name: ... (see $name --help)'"; return; }
  local word
  for word in "$@"; do
    [[ "$line" == *"$word"* ]] || { fail "$name $what: stderr does not name '$word'"; return; }
  done
}

listed=()
while [ $# -ge 2 ]; do
  tool="$1"; flag="$2"; shift 2
  listed+=("$(readlink -f "$tool")")
  name="$(basename "$tool")"
  before=$failures
  timeout 20 "$tool" --help >"$out" 2>"$err"; rc=$?
  if [ "$rc" -ne 0 ] || [ -s "$err" ]; then
    fail "$name --help: exit status $rc (want 0) or output on stderr"
  elif ! grep -q "^Usage: $name " "$out"; then
    fail "$name --help: no 'Usage: $name ...' line"
  elif ! grep -q -- "--version" "$out" || ! grep -q -- "--help" "$out"; then
    fail "$name --help: does not name --help and --version"
  elif [ -n "$flag" ] && ! grep -q -- "$flag" "$out"; then
    fail "$name --help: does not name $flag (its numeric flag in tools/$name's meson.build)"
  fi
  timeout 20 "$tool" --version >"$out" 2>"$err"; rc=$?
  if [ "$rc" -ne 0 ] || [ -s "$err" ] || [ "$(cat "$out")" != "$name $version" ]; then
    fail "$name --version: exit status $rc, want 0 and exactly '$name $version'"
  fi
  timeout 20 "$tool" --no-such-flag >"$out" 2>"$err"; rc=$?
  usage_error "$name" "--no-such-flag" "--no-such-flag"
  if [ -n "$flag" ]; then
    timeout 20 "$tool" "$flag" abc >"$out" 2>"$err"; rc=$?
    usage_error "$name" "$flag abc" "$flag" "abc"
  fi
  if [ "$failures" -eq "$before" ]; then
    echo "ok: $name (${flag:-it has no numeric flag}${flag:+ abc})"
  fi
done

# Every installed executable defined under tools/ is one of those above.
missing="$("$python" - "$build_root" "$source_root/tools" "${listed[@]}" <<'PY'
import json, os, sys
build, tools, listed = sys.argv[1], os.path.realpath(sys.argv[2]), set(sys.argv[3:])
with open(os.path.join(build, "meson-info", "intro-targets.json")) as f:
    targets = json.load(f)
for t in targets:
    defined = os.path.realpath(t["defined_in"])
    if t["type"] == "executable" and t["installed"] and defined.startswith(tools + os.sep):
        for path in t["filename"]:
            if os.path.realpath(path) not in listed:
                print(os.path.basename(path))
PY
)"
missing="$(echo $missing)"  # one line
if [ -n "$missing" ]; then
  echo "FAIL: installed tools not in bagua_tools (add them in their meson.build): $missing"
  failures=$((failures + 1))
fi
[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "ok: ${#listed[@]} tools"
