#!/usr/bin/env bash
# Algorithms on 2 GPUs (one rank each) over NCCL's network path (P2P and SHM off, loopback):
#   1. per-algorithm step time and bytes on the wire (bench/algorithms_bench, BM_AlgorithmStepNccl:
#      a 64 MiB model of CUDA tensors), over Bagua-Net and over NCCL's Socket transport, same run;
#   2. the CUDA MinMaxUInt8 kernels' bandwidth against the device-to-device copy of the same
#      floats (BM_Cuda, the peer), same run; the target is >= 70% of the copy.
# Env from bench/gpu/run.sh: ROOT, BUILD, OUT, PLUGIN_DIR. Detail in $OUT/40-algorithms.log.
set -uo pipefail
B="$BUILD/bench/algorithms_bench"
LOG="$OUT/40-algorithms.log"
: > "$LOG"
[ -x "$B" ] || { echo "40-algorithms: $B was not built (Google Benchmark missing?)"; exit 1; }
NET=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1)

run_net() {  # label, then env assignments
  local label="$1"; shift
  echo "===== $label: $*" >> "$LOG"
  env "${NET[@]}" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET "$@" \
    timeout 80 "$B" --benchmark_filter='BM_AlgorithmStepNccl' > "$OUT/40-$label.txt" 2>&1
  local rc=$?
  cat "$OUT/40-$label.txt" >> "$LOG"
  echo "-- $label (rc=$rc, $(grep -m1 -oE 'Using network [A-Za-z_]+' "$OUT/40-$label.txt" || echo 'network ?'))"
  grep -E 'ERROR OCCURRED' "$OUT/40-$label.txt" | head -3
  sed -n '/ratios to gradient_allreduce/,$p' "$OUT/40-$label.txt" | tail -n +2
}

run_net bagua LD_LIBRARY_PATH="$PLUGIN_DIR:${LD_LIBRARY_PATH:-}" NCCL_NET_PLUGIN=bagua NCCL_NET=Bagua
run_net socket NCCL_NET_PLUGIN=none NCCL_NET=Socket

# Bagua-Net against Socket, per algorithm (step time ratio).
python3 - "$OUT/40-bagua.txt" "$OUT/40-socket.txt" <<'PY'
import re, sys
def rows(path):
    out, on = {}, False
    for line in open(path, errors="replace"):
        if "ratios to gradient_allreduce" in line:
            on = True
            continue
        m = re.match(r"\s+(\w+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x", line) if on else None
        if m:
            out[m.group(1)] = float(m.group(4))
    return out
b, s = rows(sys.argv[1]), rows(sys.argv[2])
print("step ms, Bagua-Net vs Socket:")
for k in b:
    if k in s and b[k] > 0:
        print(f"  {k:28s} bagua {b[k]:8.2f}  socket {s[k]:8.2f}  socket/bagua {s[k] / b[k]:5.2f}x")
PY

echo "===== CUDA kernels" >> "$LOG"
timeout 60 "$B" --benchmark_filter='BM_Cuda' --benchmark_format=json > "$OUT/40-kernels.json" 2>> "$LOG"
cat "$OUT/40-kernels.json" >> "$LOG"
python3 - "$OUT/40-kernels.json" <<'PY'
import json, sys
try:
    bms = json.load(open(sys.argv[1]))["benchmarks"]
except Exception as e:
    print(f"kernel benchmark output unreadable: {e}")
    sys.exit(0)
kinds = {0: "device copy (peer)", 1: "compress", 2: "decompress"}
rates = []
for b in bms:
    if b.get("error_occurred"):
        print(f"  {b['name']}: {b.get('error_message')}")
        continue
    parts = dict(p.split(":") for p in b["name"].split("/")[1:] if ":" in p)
    rates.append((int(parts["kind"]), int(parts["n"]), int(parts["chunks"]),
                  int(parts.get("calls", 1)), b["bytes_per_second"]))
copy = {(n, calls): bps for kind, n, chunks, calls, bps in rates if kind == 0}
print("CUDA MinMaxUInt8 kernels (input float bytes/s) against the device copy of the same n and")
print("calls per timing (1: one call between events, launch included; 10: back to back), same run:")
for kind, n, chunks, calls, bps in rates:
    c = copy.get((n, calls))
    pct = f"{100 * bps / c:5.1f}% of copy" if c else ""
    print(f"  {kinds[kind]:20s} n={n:<9d} chunks={chunks} calls={calls:<2d}: {bps / 1e9:8.1f} GB/s {pct}")
for kind in (1, 2):
    for calls in (1, 10):
        r = [bps / copy[(n, cl)] for k, n, chunks, cl, bps in rates
             if k == kind and cl == calls and (n, cl) in copy]
        if r:
            print(f"  {kinds[kind]}/copy, calls={calls}: min {min(r):.2f}, max {max(r):.2f}"
                  " (target >= 0.70)")
PY
