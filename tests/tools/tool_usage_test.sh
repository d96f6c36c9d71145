#!/usr/bin/env bash
# What a new user tries first with a tool: `--help` must exit 0 with a usage message (and run
# nothing), and an unknown option must fail fast with a message on stderr.
# usage: tool_usage_test.sh TOOL
set -uo pipefail
tool="$1"
name="$(basename "$tool")"
out="$(mktemp)"; err="$(mktemp)"
trap 'rm -f "$out" "$err"' EXIT
timeout 20 "$tool" --help >"$out" 2>"$err"
rc=$?
if [ "$rc" -ne 0 ] || ! cat "$out" "$err" | grep -qi 'usage'; then
  echo "FAIL: $name --help exited with $rc (want 0) or printed no usage:"
  cat "$out" "$err" | tail -20
  exit 1
fi
timeout 20 "$tool" --no-such-option >"$out" 2>"$err"
rc=$?
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ ! -s "$err" ]; then
  echo "FAIL: $name --no-such-option exited with $rc (want a usage error) or said nothing on stderr"
  cat "$out" "$err" | tail -20
  exit 1
fi
echo "ok: $name: --help and an unknown option"
