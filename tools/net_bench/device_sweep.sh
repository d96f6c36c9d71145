#!/usr/bin/env bash
# Bagua-Net sweep on a bigger machine (e.g. the GPU host): loopback point-to-point numbers from
# bagua-net-bench and, when the project's bagua-nccl-bench was built, a real NCCL all-reduce
# between two GPUs over the network path for several BAGUA_NET_NSTREAMS values.
#   tools/net_bench/device_sweep.sh BUILD_DIR [OUT_DIR]
set -uo pipefail
BUILD="$1"; OUT="${2:-${OUT:-./net-sweep}}"
mkdir -p "$OUT"
BENCH="$BUILD/tools/net_bench/bagua-net-bench"
echo "=== cores: $(nproc)"
for conns in 1 4; do
  echo "=== bagua-net-bench, $conns connection(s)"
  "$BENCH" --sizes 64K,512K,1M,4M,16M --streams 1,2,4,8,16 --conns "$conns" --seconds 0.3 \
    --latency-sizes 8,64K,1M --json "$OUT/p2p-conns$conns.json" | tee "$OUT/p2p-conns$conns.txt"
done
NCCL_BENCH="$BUILD/tools/nccl_bench/bagua-nccl-bench"
if [ -x "$NCCL_BENCH" ] && [ "${SWEEP_ALLREDUCE:-1}" = 1 ]; then
  for n in ${SWEEP_NSTREAMS:-2 4 8 16}; do
    echo "=== all-reduce, Bagua-Net, BAGUA_NET_NSTREAMS=$n"
    env NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 \
      NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH="$BUILD/net_plugin:${LD_LIBRARY_PATH:-}" \
      NCCL_NET_PLUGIN=bagua NCCL_NET=Bagua BAGUA_NET_NSTREAMS="$n" NCCL_DEBUG=WARN \
      timeout 200 "$NCCL_BENCH" --ranks 2 --min 1M --max 256M --iters 10 --warmup 3 \
      --label "bagua-n$n" --json "$OUT/allreduce-n$n.json" 2>&1 | tail -14
  done
fi
