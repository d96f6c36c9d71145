#!/usr/bin/env bash
# examples/cpp_trainer (the SDK example users copy), built in the tree.
# usage: cpp_trainer_test.sh BAGUARUN TRAINER ALGORITHM [trainer args...]
#   2 ranks on loopback must exit 0 (the trainer checks the loss and its averaged model itself)
#   and both ranks must print their summary; for an algorithm that keeps replicas identical it
#   must say that no weight differs between ranks.
# usage: cpp_trainer_test.sh --usage TRAINER "NAME, NAME, ..."
#   --help exits 0 naming every option and exactly the algorithms given (those the tests run);
#   an unknown option or algorithm exits 2 with one line on stderr naming it, before any
#   training.
set -uo pipefail
out="$(mktemp)"; err="$(mktemp)"
trap 'rm -f "$out" "$err"' EXIT
fail() { echo "FAIL: $*"; cat "$out" "$err" | grep -v '^\[#' | tail -20; exit 1; }

if [ "$1" = "--usage" ]; then
  trainer="$2"; tested="$3"
  timeout 20 "$trainer" --help >"$out" 2>"$err"; rc=$?
  [ "$rc" -eq 0 ] || fail "--help exited with $rc, want 0"
  for word in Usage: --steps --algorithm --help; do
    grep -q -- "$word" "$out" || fail "--help does not mention $word"
  done
  listed="$(sed -nE 's/.*one of: (.*) \(default.*/\1/p' "$out")"
  [ "$listed" = "$tested" ] || fail "--help lists '$listed', the tests run '$tested'"
  for bad in "--no-such-option" "--algorithm no_such_algorithm" "--steps"; do
    # shellcheck disable=SC2086
    timeout 20 "$trainer" $bad >"$out" 2>"$err"; rc=$?
    [ "$rc" -eq 2 ] || fail "'$bad' exited with $rc, want 2"
    [ "$(wc -l <"$err")" -eq 1 ] || fail "'$bad': want one line on stderr"
    grep -q -- "${bad##* }" "$err" || fail "'$bad': stderr does not name ${bad##* }"
  done
  echo "ok: --help, an unknown option, an unknown algorithm, a missing value"
  exit 0
fi

launcher="$1"; trainer="$2"; algorithm="$3"; shift 3
timeout 240 "$launcher" --nproc_per_node 2 --master_addr 127.0.0.1 --master_port 0 -- \
  "$trainer" --algorithm "$algorithm" "$@" >"$out" 2>"$err"; rc=$?
[ "$rc" -eq 0 ] || fail "$algorithm: exited with $rc"
case "$algorithm" in
  decentralized | low_precision_decentralized | async) promise=' [0-9]+ differ between ranks \(allowed\)' ;;
  *) promise=' 0 differ between ranks \(must be 0\)' ;;
esac
n="$(grep -cE "^bagua-cpp-trainer: rank [01]/2, $algorithm, loss .*,$promise" "$out")"
[ "$n" = 2 ] || fail "$algorithm: want two ranks' summaries matching '$promise', got $n"
grep -E '^bagua-cpp-trainer: rank' "$out" | sed 's/^/ok: /'
