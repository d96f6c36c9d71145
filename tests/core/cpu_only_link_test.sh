#!/usr/bin/env bash
# A CPU-only program links bagua-core alone and runs with no CUDA library reachable:
#  1. neither the program nor any libbagua_* library it loads has a NEEDED entry for libcudart,
#     libcuda or libnccl (a CUDA dependency creeping back into bagua-core fails here);
#  2. copied with those libraries (and nothing else: libbagua_core_cuda stays behind) into a
#     fresh folder, and run with only that folder as LD_LIBRARY_PATH and a clean environment,
#     ldd resolves every library there and lists no CUDA or NCCL one;
#  3. the program runs there: a 2-rank host all-reduce over the TCP store, the NCCL backend
#     refused with the error that names what is missing, no CUDA or NCCL library loaded
#     (cpu_only_program.cc);
#  4. with CUDA_HALF=yes, the program in the build tree (libbagua_core_cuda beside
#     libbagua_core) asking for the NCCL backend loads libbagua_core_cuda.
# usage: cpu_only_link_test.sh PROGRAM 'WORDS' CUDA_HALF
#   PROGRAM    the build tree's cpu_only_program, linked with the shared libbagua_core
#   WORDS      what the NCCL backend's error must contain in step 3
#   CUDA_HALF  yes where this build has libbagua_core_cuda, else no
set -uo pipefail
prog="$(realpath "$1")"; words="$2"; cuda_half="$3"
T="$(mktemp -d /tmp/bagua-cpu-only.XXXXXX)"
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cuda_re='lib(cudart|cuda|nccl)\.so'

# The bagua libraries the program loads, as the build tree resolves them.
mapfile -t libs < <(ldd "$prog" | sed -nE 's/^\s*(libbagua_[^ ]+) => (\/[^ ]+) .*/\2/p')
printf '%s\n' "${libs[@]}" | grep -q '/libbagua_core\.so\.' \
  || fail "the program does not load libbagua_core: $(ldd "$prog" | grep bagua)"
for f in "$prog" "${libs[@]}"; do
  needed=$(readelf -d "$f" | sed -nE 's/.*\(NEEDED\).*\[(.*)\]/\1/p')
  if grep -E "$cuda_re" <<< "$needed"; then
    fail "$(basename "$f") has a NEEDED entry for a CUDA or NCCL library (above)"
  fi
  echo "$(basename "$f"): NEEDED $(tr '\n' ' ' <<< "$needed")"
done

mkdir -p "$T/lib" "$T/run"
cp "$prog" "$T/cpu_only_program"
for f in "${libs[@]}"; do cp "$f" "$T/lib/"; done
[ ! -e "$T/lib/libbagua_core_cuda.so.${libs[0]##*.so.}" ] || fail "libbagua_core_cuda was copied"
key=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')  # a job key: no "no job key" warnings
clean=(env -i PATH=/usr/bin:/bin HOME="$T/run" LD_LIBRARY_PATH="$T/lib" BAGUA_JOB_KEY="$key")
deps=$("${clean[@]}" ldd "$T/cpu_only_program")
if grep -E "$cuda_re|not found" <<< "$deps"; then
  fail "ldd with LD_LIBRARY_PATH=$T/lib alone: a CUDA/NCCL library or a missing one (above)"
fi
while read -r lib; do
  grep -qE "^\s*$lib => $T/lib/" <<< "$deps" \
    || fail "$lib does not resolve to the copy: $(grep "$lib" <<< "$deps")"
done < <(printf '%s\n' "${libs[@]}" | xargs -n1 basename)
echo "ldd (LD_LIBRARY_PATH=$T/lib alone): every libbagua_* from the copy, no CUDA or NCCL library"

run() {  # LABEL PROGRAM ARGS...: runs it from $T/run, wants exit 0 and both ranks' lines
  local label="$1"; shift
  (cd "$T/run" && BAGUA_JOB_KEY="$key" timeout 120 "$@") > "$T/out" 2>&1
  rc=$?
  sed "s/^/[$label] /" "$T/out"
  [ "$rc" = 0 ] || fail "$label: cpu_only_program exited $rc"
  [ "$(grep -c '^cpu_only_program rank [01]/2: host all-reduce of 1000 floats correct' "$T/out")" = 2 ] \
    || fail "$label: not both ranks' success lines"
}
run copy "${clean[@]}" "$T/cpu_only_program" refused "$words"
if [ "$cuda_half" = yes ]; then
  run build-tree "$prog" loads
  grep -q 'NCCL backend: libbagua_core_cuda loaded' "$T/out" || fail "build-tree: no load line"
fi
echo "PASS"
