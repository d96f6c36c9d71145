#!/usr/bin/env bash
# A CPU-only program links bagua-core, bagua-algorithms, bagua-optimizer and bagua-loader and
# runs with no CUDA library reachable:
#  1. neither the program nor any libbagua_* library it loads has a NEEDED entry for libcudart,
#     libcuda or libnccl (a CUDA dependency creeping back into one of them fails here), and none
#     of them is a CUDA half (libbagua_*_cuda);
#  2. copied with those libraries (and nothing else: the libbagua_*_cuda halves stay behind) into
#     a fresh folder, and run with only that folder as LD_LIBRARY_PATH and a clean environment,
#     ldd resolves every library there and lists no CUDA or NCCL one;
#  3. the program runs there (cpu_only_program.cc): a 2-rank host all-reduce over the TCP store,
#     5 ByteGrad steps with a fused SGD leaving equal weights on both ranks, a pinned data loader
#     epoch; then every CUDA path refused with the error that names what is missing (the loader
#     falling back to mlock), and no CUDA or NCCL library loaded;
#  4. where the build has CUDA halves, the program in the build tree (each half beside its
#     library) asking for each library's CUDA path loads that library's half; with a GPU
#     (nvidia-smi lists one), MinMaxUInt8 on device memory equals the host kernel's bytes.
# usage: cpu_only_link_test.sh PROGRAM CORE_WORDS ALGO_WORDS OPTIM_WORDS 'HALVES'
#   PROGRAM     the build tree's cpu_only_program, linked with the shared libraries
#   *_WORDS     what the CUDA path's error of core, algorithms and optimizer must contain (step 3)
#   HALVES      the libraries whose CUDA half this build has (core algorithms optimizer loader)
set -uo pipefail
prog="$(realpath "$1")"; core_words="$2"; algo_words="$3"; optim_words="$4"; halves="$5"
T="$(mktemp -d /tmp/bagua-cpu-only.XXXXXX)"
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cuda_re='lib(cudart|cuda|nccl)\.so'

# The bagua libraries the program loads, as the build tree resolves them.
mapfile -t libs < <(ldd "$prog" | sed -nE 's/^\s*(libbagua_[^ ]+) => (\/[^ ]+) .*/\2/p')
for want in core algorithms optimizer loader; do
  printf '%s\n' "${libs[@]}" | grep -q "/libbagua_${want}\.so\." \
    || fail "the program does not load libbagua_$want: $(ldd "$prog" | grep bagua)"
done
for f in "$prog" "${libs[@]}"; do
  case "$(basename "$f")" in libbagua_*_cuda.so*) fail "the program links a CUDA half: $f" ;; esac
  needed=$(readelf -d "$f" | sed -nE 's/.*\(NEEDED\).*\[(.*)\]/\1/p')
  if grep -E "$cuda_re" <<< "$needed"; then
    fail "$(basename "$f") has a NEEDED entry for a CUDA or NCCL library (above)"
  fi
  echo "$(basename "$f"): NEEDED $(tr '\n' ' ' <<< "$needed")"
done

mkdir -p "$T/lib" "$T/run"
cp "$prog" "$T/cpu_only_program"
for f in "${libs[@]}"; do cp "$f" "$T/lib/"; done
if ls "$T/lib" | grep -q '_cuda\.so'; then fail "a CUDA half was copied: $(ls "$T/lib")"; fi
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
  [ "$(grep -c '^cpu_only_program rank [01]/2: host all-reduce of 1000 floats correct; bytegrad + fused SGD: 5 steps, weights equal on both ranks; loader: 10 samples in order' "$T/out")" = 2 ] \
    || fail "$label: not both ranks' success lines"
}
run copy "${clean[@]}" "$T/cpu_only_program" refused "$core_words" "$algo_words" "$optim_words"
if [ -n "$halves" ]; then
  # shellcheck disable=SC2086  # one argument per half
  run build-tree "$prog" loads $halves
  for h in $halves; do
    grep -q "libbagua_${h}_cuda loaded" "$T/out" || fail "build-tree: no load line for $h"
  done
  # With a GPU, the kernels run through the shared libraries (cpu_only_program.cc).
  if [[ " $halves " == *" algorithms "*" optimizer "* ]] && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    [ "$(grep -c 'MinMaxUInt8 on cuda:0 equals the host bytes' "$T/out")" = 2 ] \
      || fail "build-tree: a GPU is visible but not both ranks ran MinMaxUInt8 on it"
  fi
fi
echo "PASS"
