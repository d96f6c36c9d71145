#!/usr/bin/env bash
# Autotuning on the host backend (no GPU needed; run here because this host is quiet and has 16+
# cores, unlike the loaded 2-core VM): 4 ranks, 512 small tensors; autotuned layout against
# Bagua's default 10 MiB bucket and the best of a grid sweep, same run (bench/RESULTS.md,
# "Autotuning"). Detail in $OUT/autotune.log.
set -uo pipefail
BENCH="$BUILD/tools/autotune_bench/bagua-autotune-bench"
[ -x "$BENCH" ] || { echo "bagua-autotune-bench not built"; exit 1; }
timeout 170 "$BENCH" --numel=2048 --bwd_us=200 --iters=40 --rounds=5 --samples=14 \
  --window_s=1.0 --warmup_s=1 > "$OUT/autotune.log" 2>&1
echo "rc=$?"
grep -E '^(model|grid \(|autotune:|  default|  grid best|  autotuned|ratios)' "$OUT/autotune.log"
