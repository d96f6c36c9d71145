#!/usr/bin/env bash
# Bagua-Net point-to-point over loopback with one slow flow: data stream 0 of every connection
# paced by the kernel to 64 MB/s. Dynamic scheduling against the equal split (what NCCL Socket
# and the original Bagua-Net do), same run; and the same without the slow stream.
set -uo pipefail
BENCH="$BUILD/tools/net_bench/bagua-net-bench"
[ -x "$BENCH" ] || { echo "bagua-net-bench not built"; exit 1; }
for slow in "" 64M; do
  echo "--- slow stream: ${slow:-none}"
  NCCL_SOCKET_IFNAME==lo timeout 100 "$BENCH" --plugin "$PLUGIN_DIR/libnccl-net.so" \
    --sizes 4M,16M,64M --streams 4,8 --latency-sizes "" --seconds 1 ${slow:+--slow-stream $slow} \
    > "$OUT/net-slow-stream${slow:+-$slow}.log" 2>&1
  echo "rc=$?"
  grep -E '^ +[0-9]+[KMG]? +[0-9]+ ' "$OUT/net-slow-stream${slow:+-$slow}.log" | head -8
done
