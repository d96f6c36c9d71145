#!/usr/bin/env bash
# Core on the GPU machine: our NCCL communicator (bagua::core, Backend::kNccl) against
# NCCL called directly, same processes, same two GPUs, same sizes, alternating, every result
# checked (bagua-nccl-comm-bench); then the libtorch integration's test and demo if built.
# Env from bench/gpu/run.sh: ROOT, BUILD, OUT. Short summary on stdout, detail in $OUT/nccl-comm.log.
set -uo pipefail
LOG="$OUT/nccl-comm.log"
: > "$LOG"
RUN="$BUILD/tools/baguarun/baguarun"
BIN="$BUILD/tools/nccl_bench/bagua-nccl-comm-bench"
if [ ! -x "$BIN" ] || [ ! -x "$RUN" ]; then
  echo "bagua-nccl-comm-bench or baguarun not built (no CUDA/NCCL?)"
  exit 1
fi
echo "== our NCCL communicator vs NCCL direct (2 GPUs; ratio = bagua busbw / nccl busbw)"
timeout 150 "$RUN" --nproc_per_node 2 --master_port 0 -- "$BIN" --sizes 1M,16M,64M,256M \
  --iters 20 --reps 3 > "$OUT/nccl-comm.txt" 2>> "$LOG"
rc=$?
cat "$OUT/nccl-comm.txt" >> "$LOG"
# The table (one row per size and pattern, last column bagua/NCCL busbw) and the ratio summary.
grep -E 'bagua-nccl-comm-bench|size|sync|batch|bagua/nccl' "$OUT/nccl-comm.txt" | head -14
echo "nccl-comm rc=$rc"
if [ "$rc" -ne 0 ]; then
  grep -E 'bagua-nccl-comm-bench:|expected|failed' "$LOG" | head -5
fi
if [ -x "$BUILD/tests/torch_ddp_test" ]; then
  timeout 60 "$BUILD/tests/torch_ddp_test" >> "$LOG" 2>&1
  echo "torch_ddp_test rc=$? ($(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$LOG" | tr '\n' ' '))"
else
  echo "torch_ddp_test not built (libtorch not found at configure time)"
fi
DEMO="$BUILD/tools/torch_demo/bagua-torch-demo"
if [ -x "$DEMO" ]; then
  timeout 60 "$RUN" --nproc_per_node 2 --master_port 0 -- "$DEMO" --steps 100 >> "$LOG" 2>&1
  echo "bagua-torch-demo rc=$? ($(grep -E 'global loss|samples/s over' "$LOG" | tr '\n' ' '))"
fi
exit $rc
