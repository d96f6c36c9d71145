#!/usr/bin/env bash
# `./bagua demo --algorithm NAME` for one algorithm: the demo trainer under baguarun, its
# defaults but for the trainer args given, with 4 ranks on loopback must exit 0 (it fails itself when the loss did not go down) and its
# summary must show a finite loss that went down.
# usage: demo_algorithm_test.sh BAGUARUN TRAINER ALGORITHM [trainer args...]
set -euo pipefail
launcher="$1"; trainer="$2"; algorithm="$3"; shift 3
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
rc=0
timeout 240 "$launcher" --nproc_per_node 4 --master_addr 127.0.0.1 --master_port 0 -- \
  "$trainer" --algorithm "$algorithm" "$@" >"$log" 2>&1 || rc=$?
summary="$(grep -E '^global loss ' "$log" || true)"
if [ "$rc" -ne 0 ] || [ -z "$summary" ]; then
  echo "FAIL: $(basename "$trainer") --algorithm $algorithm exited with $rc; last lines:"
  grep -v '^\[#' "$log" | tail -20
  exit 1
fi
# "global loss A -> B, accuracy C%"
read -r first last < <(echo "$summary" | sed -E 's/^global loss ([^ ]+) -> ([^,]+),.*/\1 \2/')
if ! awk -v a="$first" -v b="$last" 'BEGIN { exit !(a == a + 0 && b == b + 0 && b < a) }'; then
  echo "FAIL: $algorithm: loss $first -> $last is not a finite decrease"
  exit 1
fi
echo "ok: $(basename "$trainer") --algorithm $algorithm: $summary"
