#!/usr/bin/env bash
# Which plugin bagua-net-bench loads when --plugin does not say: BAGUA_NET_PLUGIN_PATH if set (a
# bad one is an error naming it), else the build tree's, else the installed one beside its prefix
# (<bindir>/PLUGIN_DIR), else an error naming BAGUA_NET_PLUGIN_PATH. Each case runs the smallest
# loopback run, so the plugin found is also loaded and driven.
# usage: net_bench_plugin_lookup_test.sh BENCH PLUGIN BINDIR PLUGIN_DIR
#   BENCH, PLUGIN   the build tree's bagua-net-bench and libnccl-net.so
#   BINDIR          Meson's bindir (relative to the prefix)
#   PLUGIN_DIR      the installed plugin's folder relative to BINDIR, as the bench was built with
set -uo pipefail
bench="$(realpath "$1")"; plugin="$(realpath "$2")"; bindir="$3"; plugin_dir="$4"
case "$bindir$plugin_dir" in
  /*) echo "SKIP: bindir or libdir is absolute ($bindir, $plugin_dir): no relocatable layout to test"
      exit 77 ;;
esac
T="$(mktemp -d /tmp/bagua-net-bench-lookup.XXXXXX)"
trap 'rm -rf "$T"' EXIT
small=(--sizes 64K --streams 1 --latency-sizes 8 --seconds 0.05 --window 1)
fails=0
fail() { echo "FAIL: $*"; sed 's/^/    /' "$T/out" "$T/err" | tail -20; fails=$((fails + 1)); }

# run EXPECTED_RC [VAR=value ...] -- ARGS: the bench (or $exe) from $T/elsewhere, with no
# BAGUA_NET_PLUGIN_PATH unless given.
exe="$bench"
run() {
  local want="$1"; shift
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  (cd "$T/elsewhere" && env -u BAGUA_NET_PLUGIN_PATH "${envs[@]}" timeout 60 "$exe" "$@") \
    > "$T/out" 2> "$T/err"
  rc=$?
  [ "$rc" = "$want" ] || { fail "exit $rc, want $want: ${envs[*]} $exe $*"; return 1; }
}
loaded() {  # the bench says it loaded $1
  grep -qxF "Bagua-Net loopback benchmark: $1" "$T/out" || { fail "did not load $1"; return 1; }
}
mkdir -p "$T/elsewhere" "$T/other"
cp "$plugin" "$T/other/libnccl-net.so"

# The build tree: its own plugin.
run 0 -- "${small[@]}" && loaded "$plugin" && echo "ok: build tree -> $plugin"
# BAGUA_NET_PLUGIN_PATH beats the build tree; --plugin beats it.
run 0 BAGUA_NET_PLUGIN_PATH="$T/other/libnccl-net.so" -- "${small[@]}" \
  && loaded "$T/other/libnccl-net.so" && echo "ok: BAGUA_NET_PLUGIN_PATH is taken first"
run 1 BAGUA_NET_PLUGIN_PATH="$T/missing.so" -- "${small[@]}" \
  && { grep -qF "BAGUA_NET_PLUGIN_PATH='$T/missing.so' is not a readable file" "$T/err" \
         || fail "no message naming BAGUA_NET_PLUGIN_PATH"; } \
  && echo "ok: a bad BAGUA_NET_PLUGIN_PATH is an error naming it"
run 0 BAGUA_NET_PLUGIN_PATH="$T/missing.so" -- --plugin "$T/other/libnccl-net.so" "${small[@]}" \
  && loaded "$T/other/libnccl-net.so" && echo "ok: --plugin beats BAGUA_NET_PLUGIN_PATH"

# An installed layout: <prefix>/<bindir>/bagua-net-bench, no build tree around it.
mkdir -p "$T/prefix/$bindir"
exe="$T/prefix/$bindir/bagua-net-bench"
cp "$bench" "$exe"
installed="$(realpath -m "$T/prefix/$bindir/$plugin_dir/libnccl-net.so")"
run 1 -- "${small[@]}" \
  && { grep -qF "BAGUA_NET_PLUGIN_PATH is not set" "$T/err" && grep -qF "$installed" "$T/err" \
         && grep -qF -- "--plugin PATH" "$T/err" \
         || fail "the error does not name BAGUA_NET_PLUGIN_PATH, $installed and --plugin"; } \
  && echo "ok: no plugin anywhere: $(cat "$T/err")"
mkdir -p "$(dirname "$installed")"
cp "$plugin" "$installed"
run 0 -- "${small[@]}" && loaded "$installed" && echo "ok: installed -> $installed"
run 0 BAGUA_NET_PLUGIN_PATH="$T/other/libnccl-net.so" -- "${small[@]}" \
  && loaded "$T/other/libnccl-net.so" && echo "ok: BAGUA_NET_PLUGIN_PATH beats the installed one"

[ "$fails" = 0 ] || { echo "$fails case(s) failed"; exit 1; }
