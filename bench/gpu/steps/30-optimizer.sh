#!/usr/bin/env bash
# Fused optimizer on the GPU: the CUDA-vs-CPU test, then CUDA fused Adam against
# torch.optim.Adam(fused=True) and (foreach=True) on the same parameter sets in the same run, with
# the copy-bandwidth bound. Env from bench/gpu/run.sh: ROOT, BUILD, OUT.
set -uo pipefail
LOG="$OUT/optimizer.log"
PY=/opt/torch/.venv/bin/python
BIN="$BUILD/bench/optimizer_gpu_bench"
: > "$LOG"
if [ -x "$BUILD/tests/optimizer_cuda_test" ]; then
  timeout 45 "$BUILD/tests/optimizer_cuda_test" >> "$LOG" 2>&1
  echo "optimizer_cuda_test rc=$? ($(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$LOG" | tr '\n' ' '))"
else
  echo "optimizer_cuda_test not built"
fi
[ -x "$BIN" ] || { echo "optimizer_gpu_bench not built (no CUDA?)"; exit 1; }
for set in small10k bert; do
  echo "== $set (ms/step from CUDA events over 200 steps; GBps at 28 B/element; bound = fraction of"
  echo "   the copy bandwidth at the same byte count; host_us = host time per step to enqueue)"
  timeout 30 "$BIN" --set "$set" --iters 200 > "$OUT/optimizer-$set.csv" 2>> "$LOG"
  echo "rc=$?" >> "$LOG"
  if [ -x "$PY" ]; then
    timeout 30 "$PY" "$ROOT/bench/gpu/optimizer_torch.py" --set "$set" --iters 200 \
      >> "$OUT/optimizer-$set.csv" 2>> "$LOG" || echo "torch script failed (see optimizer.log)"
  else
    echo "no $PY: torch comparison left out"
  fi
  cat "$OUT/optimizer-$set.csv" | column -t -s, 2>/dev/null || cat "$OUT/optimizer-$set.csv"
  cat "$OUT/optimizer-$set.csv" >> "$LOG"
  # Ratios against torch in the same run.
  awk -F, '$1=="bagua_fused"{b=$5} $1=="bagua_fused_nocheck"{n=$5} $1=="torch_fused"{f=$5}
    $1=="torch_foreach"{e=$5}
    END{ if (b>0 && f>0) printf "bagua_fused speed vs torch fused: %.2fx", f/b;
         if (b>0 && e>0) printf ", vs torch foreach: %.2fx", e/b;
         if (n>0 && f>0) printf "; nocheck vs torch fused: %.2fx", f/n; print "" }' "$OUT/optimizer-$set.csv"
done
