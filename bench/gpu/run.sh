#!/usr/bin/env bash
# GPU checks and benchmarks, for a machine with (at least) two NVIDIA GPUs, NCCL, a compiler and
# Meson; no network needed. One call does it all, so a short device lease is enough:
#   1. build the project in build-gpu (release), against the NCCL that PyTorch ships if found;
#   2. (step 5 below)
#   3. NCCL all-reduce between two GPUs over the network path (P2P and SHM off, loopback),
#      NCCL's Socket transport (default, and tuned 4x4) against Bagua-Net, same run, sizes
#      1 MiB..1 GiB, every result checked; NCCL_DEBUG=INFO proves which plugin NCCL loaded;
#   4. a summary table with the ratios (bench/gpu/summarize.py);
#   5. the whole test suite (the GPU/NCCL tests run here instead of skipping);
#   6. the per-capability steps in bench/gpu/steps/.
# BAGUA_GPU_PHASES (default "net steps tests") picks what runs after the build, so that a long
# run can be split over several device calls on the same warm machine.
# Shorter calls: BAGUA_GPU_MESON_ARGS (extra setup options, e.g. -Dgpu_arch=90: one architecture
# instead of all), BAGUA_GPU_TARGETS (an extended regex over Meson's target names: build only
# those, e.g. '^(_bagua_ext.*|nccl-net|baguarun)$'; nccl-net brings its alias
# libnccl-net-bagua.so, a target of its own, which NCCL_NET_PLUGIN=bagua loads),
# BAGUA_GPU_NO_BUILD=1 (no build-gpu at all:
# for steps that build what they need, like 85-install), BAGUA_GPU_DEADLINE (seconds from the
# start: every step's limit is cut so that the last one ends by then; a device call has 600 s).
# Multi-GPU machines: BAGUA_GPU_RANKS=4 for the net phase's all-reduces (one GPU a
# rank), DDP_GPUS=2|4 and DDP_PARTS=hier for step 80, step 70 takes every visible GPU.
# Output goes to $OUT (the device tool's folder) or ./gpu-out.
#
# usage: bench/gpu/run.sh [--quick] [--skip-tests]
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${OUT:-$ROOT/gpu-out}"
mkdir -p "$OUT"
BUILD="${BAGUA_GPU_BUILD_DIR:-$ROOT/build-gpu}"
QUICK=0; SKIP_TESTS=0
for a in "$@"; do
  case "$a" in
    --quick) QUICK=1 ;;
    --skip-tests) SKIP_TESTS=1 ;;
    *) echo "run.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done
log() { echo "=== $* [$(date +%T)]"; }
PHASES=" ${BAGUA_GPU_PHASES:-net steps tests} "
want() { [[ "$PHASES" == *" $1 "* ]]; }

# NVLink multicast stays off on shared hosts.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

log "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
nproc; g++ --version | head -1; meson --version

NCCL_HOME_DIR="${NCCL_HOME:-}"
if [ -z "$NCCL_HOME_DIR" ]; then
  NCCL_HOME_DIR=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)
fi
log "NCCL home: ${NCCL_HOME_DIR:-<cuda>}"
ls "$NCCL_HOME_DIR"/lib "$NCCL_HOME_DIR"/include 2>/dev/null | head

log "configure + build ($BUILD)"
STANDALONE=0
read -r -a MESON_EXTRA <<< "${BAGUA_GPU_MESON_ARGS:-}"
if [ "${BAGUA_GPU_NO_BUILD:-0}" = 1 ]; then
  log "no build (BAGUA_GPU_NO_BUILD=1)"
elif [ ! -f "$BUILD/build.ninja" ]; then
  VENV_PY=/opt/torch/.venv/bin/python  # the Python front end is built for torch's interpreter
  [ -x "$VENV_PY" ] || VENV_PY=""
  if ! meson setup "$BUILD" "$ROOT" -Dbuildtype=release ${NCCL_HOME_DIR:+-Dnccl_home=$NCCL_HOME_DIR} \
      ${VENV_PY:+-Dpython=$VENV_PY} "${MESON_EXTRA[@]}" \
      > "$OUT/configure.log" 2>&1; then
    grep -E 'ERROR|Dependency|not found' "$OUT/configure.log" | tail -15
    echo "full configure failed: building the plugin and the benches alone"
    rm -rf "$BUILD"
    "$ROOT/tools/net_bench/build_standalone.sh" "$BUILD" "$NCCL_HOME_DIR" > "$OUT/build.log" 2>&1 \
      || { tail -40 "$OUT/build.log"; exit 1; }
    STANDALONE=1
  fi
  tail -22 "$OUT/configure.log"
fi
if [ "$STANDALONE" = 0 ] && [ "${BAGUA_GPU_NO_BUILD:-0}" != 1 ]; then
  targets=()
  if [ -n "${BAGUA_GPU_TARGETS:-}" ]; then
    mapfile -t targets < <(meson introspect "$BUILD" --targets | python3 -c '
import json, re, sys
want = re.compile(sys.argv[1])
targets = json.load(sys.stdin)
names = {t["name"] for t in targets if want.search(t["name"])}
if "nccl-net" in names:  # NCCL_NET_PLUGIN=bagua loads the alias, a target of its own
    names.add("libnccl-net-bagua.so")
for t in targets:
    if t["name"] in names:
        for f in t["filename"]:
            print(f)' "$BAGUA_GPU_TARGETS" | sed "s|^$BUILD/||")
    echo "building ${#targets[@]} files of the targets matching $BAGUA_GPU_TARGETS"
    [ "${#targets[@]}" -gt 0 ] || { echo "BAGUA_GPU_TARGETS=$BAGUA_GPU_TARGETS matches no target"; exit 1; }
  fi
  # -k 0: one broken target must not stop the benches and the rest of the suite.
  t_build=$SECONDS
  ninja -C "$BUILD" -k 0 "${targets[@]}" > "$OUT/build.log" 2>&1 || { grep -B2 -A12 'FAILED' "$OUT/build.log" | head -60; echo "BUILD FAILED (continuing with what was built)"; }
  tail -2 "$OUT/build.log"
  echo "build: $((SECONDS - t_build)) s"
fi

BENCH="$BUILD/tools/nccl_bench/bagua-nccl-bench"
PLUGIN_DIR="$BUILD/net_plugin"
if want net; then
  [ -x "$BENCH" ] || { echo "bagua-nccl-bench was not built (NCCL or CUDA missing?)"; exit 1; }
  [ -f "$PLUGIN_DIR/libnccl-net.so" ] || { echo "the plugin was not built"; exit 1; }
fi

MAX=1G; ITERS=20
# BAGUA_GPU_RANKS: ranks (one GPU each) of the net phase's all-reduces (default 2; 4 on 4 GPUs).
RANKS=${BAGUA_GPU_RANKS:-2}
case "$RANKS" in ''|*[!0-9]*|0|1) echo "BAGUA_GPU_RANKS='$RANKS': expected a rank count >= 2"; exit 1 ;; esac
if [ "$QUICK" = 1 ]; then MAX=256M; ITERS=10; fi
NETPATH=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1)

run_case() {  # label, then env assignments
  local label="$1"; shift
  log "all-reduce: $label"
  env "${NETPATH[@]}" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV "$@" \
    timeout 300 "$BENCH" --ranks "$RANKS" --min 1M --max "$MAX" --iters "$ITERS" --warmup 5 \
    --label "$label" --json "$OUT/$label.json" > "$OUT/$label.log" 2>&1
  local rc=$?
  grep -v ' NCCL INFO ' "$OUT/$label.log" | tail -15
  grep -E 'NET/Plugin|Using network|NET/Bagua.*(streams|NSTREAMS|Using)|Loaded net plugin|TUNER/Plugin: Using|TUNER/Bagua' \
    "$OUT/$label.log" | sed -E "s/.*NCCL INFO //" | sort -u | head -10
  echo "rc=$rc"
}

if want net; then
run_case socket NCCL_NET_PLUGIN=none NCCL_NET=Socket
run_case socket-4x4 NCCL_NET_PLUGIN=none NCCL_NET=Socket NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4
run_case bagua LD_LIBRARY_PATH="$PLUGIN_DIR:${LD_LIBRARY_PATH:-}" NCCL_NET_PLUGIN=bagua NCCL_NET=Bagua ${BAGUA_GPU_ENV:-}

log "summary"
python3 "$ROOT/bench/gpu/summarize.py" "$OUT" socket socket-4x4 bagua | tee "$OUT/summary.md"

# Extra Bagua-Net settings to compare, as "label:VAR=value+VAR=value" words (same run, up to the
# size given by BAGUA_GPU_EXTRA_MAX); e.g. BAGUA_GPU_EXTRA="speed100:BAGUA_NET_SPEED_MBPS=100000".
if [ -n "${BAGUA_GPU_EXTRA:-}" ]; then
  labels=(socket bagua)
  for case in $BAGUA_GPU_EXTRA; do
    label="${case%%:*}"; vars="${case#*:}"
    MAX_SAVED="$MAX"; MAX="${BAGUA_GPU_EXTRA_MAX:-$MAX}"
    # shellcheck disable=SC2086
    run_case "$label" LD_LIBRARY_PATH="$PLUGIN_DIR:${LD_LIBRARY_PATH:-}" NCCL_NET_PLUGIN=bagua \
      NCCL_NET=Bagua ${vars//+/ }
    MAX="$MAX_SAVED"
    labels+=("$label")
  done
  python3 "$ROOT/bench/gpu/summarize.py" "$OUT" "${labels[@]}" | tee "$OUT/summary-extra.md"
fi

# GPU kernels' own benchmarks, when built.
if [ -x "$BUILD/bench/algorithms_bench" ]; then
  log "compression kernels (algorithms_bench, CUDA)"
  timeout 120 "$BUILD/bench/algorithms_bench" --benchmark_filter='BM_Cuda' 2>&1 | tail -20
fi
fi  # phase net

# Further GPU steps, one script per capability (bench/gpu/steps/NN-name.sh, run in order). Each
# gets ROOT, BUILD, OUT, NCCL_HOME_DIR and PLUGIN_DIR in its environment, prints a short summary
# on stdout and keeps its detail in "$OUT/<name>.log" (folded into gpu-logs.tgz at the end).
# 05-cuda-kernels.sh checks the kernels' architectures (cuobjdump) and runs the CUDA tests as
# built and with CUDA_FORCE_PTX_JIT=1; alone: BAGUA_GPU_PHASES=steps BAGUA_GPU_STEPS=05.
export ROOT BUILD OUT NCCL_HOME_DIR PLUGIN_DIR
if [ "$STANDALONE" = 0 ] && want steps; then
  for step in "$ROOT"/bench/gpu/steps/*.sh; do
    [ -e "$step" ] || continue
    if [ -n "${BAGUA_GPU_STEPS:-}" ]; then  # e.g. "10 40": only the steps with these prefixes
      keep=0
      for p in $BAGUA_GPU_STEPS; do [[ "$(basename "$step")" == "$p"* ]] && keep=1; done
      [ "$keep" = 1 ] || continue
    fi
    log "step $(basename "$step")"
    # A step may ask for more than BAGUA_GPU_STEP_TIMEOUT with a "# step-timeout: SECONDS" line.
    limit=${BAGUA_GPU_STEP_TIMEOUT:-240}
    asked=$(grep -m1 -oE '^# step-timeout: [0-9]+' "$step" | grep -oE '[0-9]+$')
    [ -n "$asked" ] && [ "$asked" -gt "$limit" ] && limit=$asked
    if [ -n "${BAGUA_GPU_DEADLINE:-}" ]; then
      left=$((BAGUA_GPU_DEADLINE - SECONDS - 10))
      [ "$left" -lt 10 ] && { echo "step $(basename "$step"): not run (BAGUA_GPU_DEADLINE)"; continue; }
      [ "$left" -lt "$limit" ] && limit=$left
    fi
    echo "(limit ${limit} s)"
    export BAGUA_STEP_DEADLINE=$(( $(date +%s) + limit ))  # epoch seconds: steps may share their time out by it
    timeout "$limit" bash "$step" 2>&1 | tail -40
    echo "step $(basename "$step") rc=${PIPESTATUS[0]}"
  done
fi

if [ "$SKIP_TESTS" = 0 ] && [ "$STANDALONE" = 0 ] && want tests; then
  log "test suite"
  # BAGUA_GPU_TEST_TIMEOUT (default 480 s; the whole suite took more on 4 GPUs: its python suites
  # run alone), BAGUA_GPU_TEST_ARGS (e.g. "--suite python --suite elastic": only those suites).
  read -r -a TEST_ARGS <<< "${BAGUA_GPU_TEST_ARGS:-}"
  timeout "${BAGUA_GPU_TEST_TIMEOUT:-480}" meson test -C "$BUILD" --no-rebuild --print-errorlogs \
    --num-processes 12 "${TEST_ARGS[@]}" > "$OUT/tests.log" 2>&1
  rc=$?
  grep -E '^ *[0-9]+/[0-9]+ |^(Ok|Fail|Skipped|Timeout):' "$OUT/tests.log" | tail -40
  # Which gtest cases skipped, and why (GPU tests must not skip here).
  grep -h -A2 '\[  SKIPPED \]' "$BUILD"/meson-logs/testlog.txt 2>/dev/null | head -20
  echo "test suite rc=$rc"
  # What each failing test said (its failed cases and the lines around them).
  python3 - "$BUILD/meson-logs/testlog.json" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    t = json.loads(line)
    if t.get("result") in ("OK", "SKIP", "EXPECTEDFAIL"):
        continue
    print(f"--- {t['name']}: {t['result']}")
    out = (t.get("stdout") or "").splitlines() + (t.get("stderr") or "").splitlines()
    keep = set()
    for i, l in enumerate(out):
        if "Failure" in l or "FAILED" in l or "error" in l.lower():
            keep.update(range(max(0, i - 3), min(len(out), i + 8)))
    for i in sorted(keep)[:80]:
        print(out[i])
PY
fi

# The device tool brings back only a few files: fold every log and JSON into one archive and keep
# the summaries beside it.
# A wheel that a step left at the top (85-install) stays apart, so that a later call can carry it.
( cd "$OUT" && ls | grep -v -E '^(summary.*\.md|gpu-logs\.tgz|.*\.whl)$' > .fold-list && \
  tar czf gpu-logs.tgz -T .fold-list && xargs -d '\n' rm -rf < .fold-list && rm -f .fold-list ) || true
ls "$OUT"
