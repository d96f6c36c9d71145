#!/usr/bin/env bash
# NCCL 2.30 (net plugin ABI v12, tuner v6) with Bagua-Net: NCCL built from its source (one GPU
# architecture, the GPU's own), then a checked all-reduce of 2 ranks on GPU 0 (MPS when there, each
# rank its own NCCL_HOSTID, P2P and SHM off: the network path over loopback) must log
#   NET/Plugin: Loaded net plugin Bagua (v12)   and   TUNER/Plugin: Using Bagua (v6)
# Needs NCCL's source in $ROOT/third_party_fetch/nccl-2.30.7 (ignored; made on the CPU machine by
#   mkdir -p third_party_fetch/nccl-2.30.7 && git -C <NVIDIA/nccl mirror> archive v2.30.7-1 \
#     src makefiles Makefile | tar -x -C third_party_fetch/nccl-2.30.7
# and carried to the device with the run tool's `carry`). The build goes to
# third_party_fetch/nccl-2.30.7-build and is reused on a warm machine: if this step's time runs out
# in the build, run it again. Last line: "nccl230: PASS|FAIL (why)".
# Alone: BAGUA_GPU_PHASES=steps BAGUA_GPU_STEPS=15 bench/gpu/run.sh
# step-timeout: 590
set -uo pipefail
LOG="$OUT/15-nccl230.log"
SRC="$ROOT/third_party_fetch/nccl-2.30.7"
NB="$ROOT/third_party_fetch/nccl-2.30.7-build"
BENCH="$BUILD/tools/nccl_bench/bagua-nccl-bench"
: > "$LOG"
fail() { echo "nccl230: FAIL ($*)"; exit 1; }
[ -f "$SRC/Makefile" ] || fail "no NCCL source in $SRC (see the top of this script)"
[ -x "$BENCH" ] || fail "bagua-nccl-bench not built"
if [ ! -f "$NB/lib/libnccl.so.2" ]; then
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
  [ -n "$cc" ] || fail "no GPU compute capability from nvidia-smi"
  echo "building NCCL 2.30.7 for sm_$cc ($(nproc) cores)"
  SECONDS=0
  make -C "$SRC" -j "$(nproc)" src.build BUILDDIR="$NB" CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" \
    NVCC_GENCODE="-gencode=arch=compute_$cc,code=sm_$cc" >> "$LOG" 2>&1 \
    || fail "NCCL build failed or was cut short after ${SECONDS} s (see 15-nccl230.log; rerun the step)"
  echo "NCCL built in ${SECONDS} s"
fi

source "$ROOT/bench/gpu/mps.sh"
start_mps "$LOG" || true

env LD_LIBRARY_PATH="$NB/lib:$PLUGIN_DIR:${LD_LIBRARY_PATH:-}" LD_PRELOAD="$NB/lib/libnccl.so.2" \
  NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 \
  NCCL_NVLS_ENABLE=0 NCCL_NET_PLUGIN=bagua NCCL_NET=Bagua NCCL_DEBUG=INFO \
  NCCL_DEBUG_SUBSYS=INIT,NET,TUNING \
  timeout 240 "$BENCH" --ranks 2 --share-gpu --min 1M --max 64M --iters 10 --warmup 3 \
  --label nccl230-bagua --json "$OUT/nccl230-bagua.json" >> "$LOG" 2>&1
rc=$?
grep -v ' NCCL INFO ' "$LOG" | grep -E '^#|^ +[0-9]+ ' | tail -9
grep -oE 'NCCL version [0-9.+a-z]+|Loaded net plugin [A-Za-z]+ \(v[0-9]+\)|TUNER/Plugin: Using [A-Za-z]+ \(v[0-9]+\)' \
  "$LOG" | sort | uniq -c
[ "$rc" = 0 ] || fail "bagua-nccl-bench rc=$rc"
grep -qE 'NCCL version 2\.30|: NCCL 230[0-9][0-9],' "$LOG" || fail "NCCL 2.30 was not the library loaded"
grep -q 'Loaded net plugin Bagua (v12)' "$LOG" || fail "no 'Loaded net plugin Bagua (v12)'"
grep -q 'TUNER/Plugin: Using Bagua (v6)' "$LOG" || fail "no 'TUNER/Plugin: Using Bagua (v6)'"
grep -E '^ +[0-9]+ ' "$LOG" | grep -q WRONG && fail "an all-reduce result was wrong"
echo "nccl230: PASS (NCCL 2.30.7 loaded Bagua-Net v12 and its tuner v6; all-reduce 1M-64M checked)"
