#!/usr/bin/env bash
# Autotuning. Two parts, < 3 minutes together; detail in $OUT/autotune.log and
# $OUT/autotune-net-live.log (bench/RESULTS.md, "Autotune").
#  1. CPU only (this host is quiet and has 16+ cores, unlike the loaded 2-core VM): 4 ranks on the
#     host backend, 512 small tensors; autotuned layout against Bagua's default 10 MiB bucket and
#     the best of a grid sweep, same run.
#  2. GPU: Bagua-Net's live knobs inside a real NCCL run (2 GPUs, NCCL forced onto the net plugin
#     over loopback): each rank switches the plugin NCCL loaded (baguaNetSetLive_v1, found by
#     autotune::NetPluginLive) between batches; default vs grid best vs GP-autotuned (active
#     streams x chunk size), every result checked.
# Env from bench/gpu/run.sh: ROOT, BUILD, OUT, PLUGIN_DIR.
set -uo pipefail
BENCH="$BUILD/bench/autotune/bagua-autotune-bench"
[ -x "$BENCH" ] || { echo "bagua-autotune-bench not built"; exit 1; }
timeout 110 "$BENCH" --numel=2048 --bwd_us=200 --iters=40 --rounds=4 --samples=14 \
  --window_s=1.0 --warmup_s=1 > "$OUT/autotune.log" 2>&1
cpu_rc=$?
echo "cpu rc=$cpu_rc"
grep -E '^(model|grid \(|autotune:|  default|  grid best|  autotuned|ratios)' "$OUT/autotune.log"

LIVE="$BUILD/bench/autotune/bagua-autotune-net-live-bench"
if [ ! -x "$LIVE" ]; then
  echo "bagua-autotune-net-live-bench not built (no CUDA/NCCL?)"
  exit 0
fi
echo "== Bagua-Net live knobs under NCCL (2 GPUs, 32 MiB float all-reduce, algbw)"
env NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo \
  NCCL_NVLS_ENABLE=0 NCCL_NET_PLUGIN=bagua NCCL_NET=Bagua \
  LD_LIBRARY_PATH="${PLUGIN_DIR:-$BUILD/net_plugin}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  timeout 60 "$LIVE" --bytes 32M --iters 5 --rounds 3 --samples 12 \
  > "$OUT/autotune-net-live.log" 2>&1
gpu_rc=$?
echo "gpu rc=$gpu_rc"
grep -E '^(plugin|bytes|default|grid best|autotuned|ratios)' "$OUT/autotune-net-live.log"
grep -E 'rank [0-9]+:|WRONG' "$OUT/autotune-net-live.log" | head -4
# The benches' exit codes decide (a grep that finds no error line is not a failure).
[ "$cpu_rc" -eq 0 ] && [ "$gpu_rc" -eq 0 ]
