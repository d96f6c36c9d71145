#!/usr/bin/env bash
# Our CUDA kernels on every GPU generation:
#   1. cuobjdump on the kernel objects (algorithms, optimizer) and the CUDA test executables:
#      machine code (--list-elf) for every architecture of the default build (-Dgpu_arch=all:
#      every sm_NN >= 70 that the build's nvcc lists) and PTX (--list-ptx) for the oldest and the
#      newest; any missing one fails the step;
#   2. the CUDA tests (optimizer_cuda, algorithms_cuda, algorithms_gpu,
#      core_nccl) as built: the driver loads this GPU's machine code;
#   3. the same tests with CUDA_FORCE_PTX_JIT=1: the driver ignores all machine code and
#      JIT-compiles PTX (here the oldest architecture's, the newest's being too new for this GPU),
#      the path a GPU newer than the toolkit takes. NCCL's kernels take it too, so core_nccl and
#      algorithms_gpu can pass only if the NCCL library carries PTX this GPU can compile: the
#      step checks (cuobjdump --list-ptx on it) and, where it carries none, leaves those two out
#      of this run and says so. optimizer_cuda and algorithms_cuda use no NCCL and must pass.
# Env from bench/gpu/run.sh: ROOT, BUILD, OUT. Detail in $OUT/cuda-kernels.log; the last line on
# stdout is the verdict: "cuda-kernels: PASS" or "cuda-kernels: FAIL (what failed)".
# step-timeout: 580
set -uo pipefail
LOG="$OUT/cuda-kernels.log"
: > "$LOG"
FAILED=()
fail() { FAILED+=("$1"); }

NVCC=$(grep -m1 -oE '[^ "]*/nvcc( |$)' "$BUILD/build.ninja" | tr -d ' ')
if [ -z "$NVCC" ] || [ ! -x "$NVCC" ]; then
  echo "the build has no CUDA kernels (no nvcc in $BUILD/build.ninja)"
  echo "cuda-kernels: FAIL (no CUDA build)"
  exit 1
fi
CUOBJDUMP="$(dirname "$NVCC")/cuobjdump"
[ -x "$CUOBJDUMP" ] || CUOBJDUMP=$(command -v cuobjdump || true)
GPU_ARCH=$(meson introspect "$BUILD" --buildoptions 2>/dev/null |
  python3 -c 'import json, sys; print(next((o["value"] for o in json.load(sys.stdin) if o["name"] == "gpu_arch"), "?"))')
# The default's architectures, from the toolkit itself (not from the build's own list).
mapfile -t ARCHS < <("$NVCC" --list-gpu-code | grep -oE '^sm_[0-9]+$' | cut -c4- |
  awk '$1 >= 70' | sort -n)
OLDEST=${ARCHS[0]}
NEWEST=${ARCHS[${#ARCHS[@]}-1]}
CC=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.')
EXPECTED="sm_${ARCHS[*]}"
echo "== cuobjdump: nvcc $("$NVCC" --version | grep -oE 'release [0-9.]+' | cut -d' ' -f2)," \
  "gpu_arch=$GPU_ARCH; expected ${EXPECTED// / sm_}, PTX compute_$OLDEST compute_$NEWEST;" \
  "this GPU sm_${CC:-?}"
[ "$GPU_ARCH" = all ] || fail "gpu_arch=$GPU_ARCH, not the default"

# archs FILE elf|ptx: the sm numbers cuobjdump lists for the file, sorted and unique.
archs() {
  local listed
  listed=$("$CUOBJDUMP" "--list-$2" "$1" 2>&1)
  echo "$listed" >> "$LOG"
  echo "$listed" | grep -oE '(sm|compute)_[0-9]+' | grep -oE '[0-9]+' | sort -un
}
if [ -z "$CUOBJDUMP" ]; then
  echo "no cuobjdump next to $NVCC or on PATH"
  fail "no cuobjdump"
else
  for f in algorithms/minmax_kernels.o algorithms/vector_kernels.o optimizer/optimizer_kernels.o \
           tests/algorithms_cuda_test tests/algorithms_gpu_test tests/optimizer_cuda_test; do
    if [ ! -f "$BUILD/$f" ]; then
      printf '  %-32s not built\n' "$f"
      fail "$f not built"
      continue
    fi
    echo "--- $f" >> "$LOG"
    elf=" $(archs "$BUILD/$f" elf | tr '\n' ' ')"
    ptx=" $(archs "$BUILD/$f" ptx | tr '\n' ' ')"
    missing=()
    n=0
    for a in "${ARCHS[@]}"; do
      if [[ "$elf" == *" $a "* ]]; then n=$((n + 1)); else missing+=("sm_$a"); fi
    done
    for a in "$OLDEST" "$NEWEST"; do
      [[ "$ptx" == *" $a "* ]] || missing+=("compute_$a(PTX)")
    done
    verdict=ok
    if [ "${#missing[@]}" -gt 0 ]; then
      verdict="MISSING ${missing[*]}"
      fail "$f lacks ${missing[*]}"
    fi
    printf '  %-32s elf %2d/%d  ptx:%s %s\n' "$f" "$n" "${#ARCHS[@]}" "${ptx% }" "$verdict"
  done
fi

# NCCL's PTX: can this GPU JIT NCCL's kernels under CUDA_FORCE_PTX_JIT=1?
NCCL_LIB=$(grep -m1 -oE '[^ "]*/libnccl\.so[.0-9]*' "$BUILD/build.ninja")
NCCL_PTX=""
if [ -n "$NCCL_LIB" ] && [ -n "$CUOBJDUMP" ]; then
  NCCL_PTX=$("$CUOBJDUMP" --list-ptx "$NCCL_LIB" 2>/dev/null | grep -oE '(sm|compute)_[0-9]+' |
    grep -oE '[0-9]+' | sort -un | tr '\n' ' ')
fi
NCCL_JIT=no
for a in $NCCL_PTX; do
  [ -n "$CC" ] && [ "$a" -le "$CC" ] && NCCL_JIT=yes
done
echo "   NCCL ${NCCL_LIB:-?}: PTX for ${NCCL_PTX:-none}-> JIT on sm_${CC:-?}: $NCCL_JIT"

# run_suite LABEL TESTS [VAR=value...]: the tests (space-separated names) under the variables;
# one line per test: result, gtest cases passed and skipped, seconds.
run_suite() {
  local label="$1" tests="$2"
  shift 2
  echo "--- meson test $tests ($label: $*)" >> "$LOG"
  # shellcheck disable=SC2086
  env "$@" timeout 260 meson test -C "$BUILD" --no-rebuild --print-errorlogs \
    --logbase "cuda-$label" $tests >> "$LOG" 2>&1
  python3 - "$BUILD/meson-logs/cuda-$label.json" "$label" <<'PY'
import json, sys
path, label = sys.argv[1], sys.argv[2]
try:
    rows = [json.loads(l) for l in open(path)]
except OSError as e:
    print(f"  {label}: no test log ({e})")
    sys.exit(0)
for t in rows:
    out = t.get("stdout") or ""
    ok, skipped = out.count("[       OK ]"), out.count("[  SKIPPED ]")
    print(f"  {label:9s} {t['name'].split(' / ')[-1].split(':')[-1]:16s} {t['result']:8s}"
          f" {ok:3d} cases passed, {skipped:2d} skipped {t.get('duration', 0):6.1f} s")
PY
}
# result LABEL TEST: the test's result in that run: "" if it did not run, SKIPPED if a case
# case skipped for want of a GPU (on the GPU machine none may).
result() {
  python3 - "$BUILD/meson-logs/cuda-$1.json" "$2" <<'PY' 2>/dev/null
import json, re, sys
for l in open(sys.argv[1]):
    t = json.loads(l)
    # meson names a test 'project / name' (older) or 'project:name' (1.12)
    if t["name"].split(" / ")[-1].split(":")[-1] == sys.argv[2]:
        # A case that skipped for want of a GPU; core_nccl's no-GPU error check skips when one is there.
        skipped = re.search(r"no CUDA device visible|needs \d+ CUDA devices", t.get("stdout") or "")
        print("SKIPPED" if t["result"] == "OK" and skipped else t["result"])
PY
}

OWN="optimizer_cuda algorithms_cuda"  # our kernels only
WITH_NCCL="algorithms_gpu core_nccl"   # our kernels and NCCL's
echo "== CUDA tests as built, then with CUDA_FORCE_PTX_JIT=1"
run_suite native "$OWN $WITH_NCCL"
# Without NCCL PTX for this GPU the NCCL tests cannot load NCCL's kernels under forced JIT (they
# would fail or hang on NCCL, not on us): they are left out of that run.
JIT_TESTS="$OWN"
[ "$NCCL_JIT" = yes ] && JIT_TESTS="$OWN $WITH_NCCL"
JIT_CACHE=$(mktemp -d)  # empty: every kernel is JIT-compiled in this run, none comes from a cache
run_suite ptx-jit "$JIT_TESTS" CUDA_FORCE_PTX_JIT=1 CUDA_CACHE_PATH="$JIT_CACHE"
jitted=$(find "$JIT_CACHE" -type f | wc -l)
echo "   JIT cache after the PTX run: $jitted files, $(du -sm "$JIT_CACHE" | cut -f1) MiB" \
  "$([ "$jitted" -gt 0 ] && echo '(the driver compiled PTX)' || echo '(empty: nothing was JIT-compiled)')"
rm -rf "$JIT_CACHE"
[ "$NCCL_JIT" = yes ] ||
  echo "   PTX JIT: $WITH_NCCL not run (NCCL carries no PTX for sm_${CC:-?}; not our kernels)"
for t in $OWN $WITH_NCCL; do
  r=$(result native "$t")
  [ "$r" = OK ] || fail "$t ${r:-did not run}"
done
for t in $JIT_TESTS; do
  r=$(result ptx-jit "$t")
  [ "$r" = OK ] || fail "$t ${r:-did not run} under CUDA_FORCE_PTX_JIT=1"
done

if [ "${#FAILED[@]}" -eq 0 ]; then
  echo "cuda-kernels: PASS"
  exit 0
fi
printf -v why '%s; ' "${FAILED[@]}"
echo "cuda-kernels: FAIL (${why%; })"
exit 1
