#!/usr/bin/env bash
# The C++ SDK as the root README installs it, with CUDA kernels for every architecture: the
# install-only configuration (release and strip=true, the project's defaults; -Dtests=false
# -Dbenchmarks=disabled -Dpython_ext=disabled) against the NCCL that torch ships, built from
# scratch in its own folder, installed with --destdir. Reports the build time, the installed
# size (bytes, all files) and the largest files; checks that the CUDA halves carry machine code
# for every architecture nvcc lists from sm_70 up. Passes when the installed tree is under
# 40 MB (40,000,000 bytes).
#
# Needs no build-gpu: BAGUA_GPU_NO_BUILD=1 BAGUA_GPU_PHASES=steps BAGUA_GPU_STEPS=86
# bench/gpu/run.sh, or alone: OUT=/some/dir bash bench/gpu/steps/86-sdk-size.sh.
# Environment: SDK_MESON_ARGS (more -Dname=value), SDK_LIMIT_BYTES (default 40000000).
# Detail in $OUT/sdk-size/; the last line is 'sdk-size: PASS|FAIL (why)'.
# step-timeout: 560
set -uo pipefail
ROOT="${ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)}"
OUT="${OUT:-$ROOT/gpu-out}"
D="$OUT/sdk-size"
B="${SDK_BUILD_DIR:-$ROOT/build-sdk-size}"
STAGE="$D/stage"
LIMIT="${SDK_LIMIT_BYTES:-40000000}"
mkdir -p "$D"
verdict() { echo "sdk-size: $*"; [[ "$*" == PASS* ]]; exit $?; }
PY=/opt/torch/.venv/bin/python
[ -x "$PY" ] || PY=python3
NCCL_HOME_DIR=$("$PY" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)
read -r -a extra <<< "${SDK_MESON_ARGS:-}"

t0=$SECONDS
rm -rf "$B" "$STAGE"
meson setup "$B" "$ROOT" -Dtests=false -Dbenchmarks=disabled -Dpython_ext=disabled \
  ${NCCL_HOME_DIR:+-Dnccl_home=$NCCL_HOME_DIR} "${extra[@]}" > "$D/configure.log" 2>&1 \
  || { tail -20 "$D/configure.log"; verdict "FAIL (meson setup: $D/configure.log)"; }
grep -E '^ *(buildtype|cuda|cuda kernels|gpu_arch|nccl) *:' "$D/configure.log" | head -6
ninja -C "$B" > "$D/build.log" 2>&1 || { grep -E 'error|FAILED' "$D/build.log" | tail -15; verdict "FAIL (build: $D/build.log)"; }
build_s=$((SECONDS - t0))
meson install -C "$B" --destdir "$STAGE" --no-rebuild > "$D/install.log" 2>&1 \
  || { tail -15 "$D/install.log"; verdict "FAIL (meson install: $D/install.log)"; }
bytes=$(find "$STAGE" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
files=$(find "$STAGE" -type f | wc -l)
echo "sdk: built in ${build_s}s on $(nproc) cores; installed $files files, $bytes bytes ($(awk -v b="$bytes" 'BEGIN {printf "%.1f", b / 1e6}') MB)"
echo "largest files (MB: file, of it CUDA fatbin, symbol and string tables):"
find "$STAGE" -type f -printf '%s %p\n' | sort -rn | head -10 | python3 -c '
import re, subprocess, sys
for line in sys.stdin:
    size, path = line.split(" ", 1)
    path = path.strip()
    secs = {}
    out = subprocess.run(["readelf", "-SW", path], capture_output=True, text=True).stdout
    for m in re.finditer(r"\]\s+(\.\S+)\s+\S+\s+[0-9a-f]+\s+[0-9a-f]+\s+([0-9a-f]+)", out):
        secs[m.group(1)] = secs.get(m.group(1), 0) + int(m.group(2), 16)
    fat = secs.get(".nv_fatbin", 0) / 1e6
    sym = (secs.get(".symtab", 0) + secs.get(".strtab", 0)) / 1e6
    print("  {:6.2f}  {:5.2f}  {:5.2f}  {}".format(int(size) / 1e6, fat, sym, path.split("/stage/", 1)[-1]))
'

# Every architecture's machine code in each CUDA half.
NVCC=$(grep -m1 -oE '[^ "]*/nvcc( |$)' "$B/build.ninja" | tr -d ' ')
[ -n "$NVCC" ] || verdict "FAIL (this build has no CUDA kernels: $D/configure.log)"
CUOBJDUMP="$(dirname "$NVCC")/cuobjdump"
want=$("$NVCC" --list-gpu-code | grep -oE '^sm_[0-9]+$' | awk '{n = substr($1, 4) + 0} n >= 70' | sort -u | tr '\n' ' ')
halves=0
while IFS= read -r lib; do
  # A half without kernels of its own (the loader's: pinned memory and copies) has no fatbin.
  readelf -SW "$lib" | grep -q '\.nv_fatbin' || { echo "$(basename "$lib"): no kernels of its own"; continue; }
  halves=$((halves + 1))
  have=$("$CUOBJDUMP" --list-elf "$lib" 2>/dev/null | grep -oE 'sm_[0-9]+' | sort -u | tr '\n' ' ')
  [ "$have" = "$want" ] || verdict "FAIL ($(basename "$lib") has machine code for [$have], want [$want])"
done < <(find "$STAGE" -name 'libbagua_*_cuda.so.*.*' -type f)
[ "$halves" -gt 0 ] || verdict "FAIL (no CUDA half with kernels installed)"
echo "machine code in each of the $halves CUDA halves with kernels: $want"
rm -rf "$B" "$STAGE"
[ "$bytes" -lt "$LIMIT" ] || verdict "FAIL ($bytes bytes installed, the bound is $LIMIT)"
verdict "PASS ($bytes bytes installed with kernels for every architecture, under $LIMIT; build ${build_s}s)"
