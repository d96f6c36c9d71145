#!/usr/bin/env bash
# Small-message diagnosis for Bagua-Net against NCCL Socket on the network path: all-reduce
# times from 64 KiB to 4 MiB for each transport under each protocol, and the algorithm/protocol
# NCCL's tuning picked (NCCL_DEBUG_SUBSYS=TUNING). Builds only the two targets it needs.
# usage: bench/gpu/latency.sh   (env: OUT, NCCL_HOME, BAGUA_LAT_EXTRA="label:VAR=v+VAR=v ...")
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${OUT:-$ROOT/gpu-out}"; mkdir -p "$OUT"
BUILD="${BAGUA_GPU_BUILD_DIR:-$ROOT/build-gpu}"
export NCCL_NVLS_ENABLE=0
NCCL_HOME_DIR="${NCCL_HOME:-$(python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null)}"
if [ ! -f "$BUILD/build.ninja" ]; then
  meson setup "$BUILD" --buildtype=release -Dnccl_home="$NCCL_HOME_DIR" -Dtests=false \
    -Dbenchmarks=disabled -Dredis=disabled > "$OUT/lat-configure.log" 2>&1 || { tail -30 "$OUT/lat-configure.log"; exit 1; }
fi
ninja -C "$BUILD" tools/nccl_bench/bagua-nccl-bench net_plugin/libnccl-net.so net_plugin/libnccl-net-bagua.so > "$OUT/lat-build.log" 2>&1 \
  || { grep -A12 FAILED "$OUT/lat-build.log" | head -40; exit 1; }
BENCH="$BUILD/tools/nccl_bench/bagua-nccl-bench"; PLUGIN_DIR="$BUILD/net_plugin"
NETPATH=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1)
SOCK=(NCCL_NET_PLUGIN=none NCCL_NET=Socket)
BAG=(LD_LIBRARY_PATH="$PLUGIN_DIR:${LD_LIBRARY_PATH:-}" NCCL_NET_PLUGIN=bagua NCCL_NET=Bagua)
one() {  # label, env...
  local label="$1"; shift
  env "${NETPATH[@]}" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING,NET "$@" timeout 120 "$BENCH" \
    --ranks 2 --min 64K --max "${LAT_MAX:-4M}" --iters 50 --warmup 10 --label "$label" > "$OUT/lat-$label.log" 2>&1
  echo "--- $label rc=$?"
  grep -v " NCCL INFO " "$OUT/lat-$label.log" | grep -E '^ +[0-9]' | awk '{printf "%s:%s ", $1, $2} END {print ""}'
  grep -E 'AllReduce.*(Algo|algorithm|proto)' "$OUT/lat-$label.log" | sed -E 's/.*NCCL INFO //' | sort | uniq -c | sort -rn | head -4
}
one socket "${SOCK[@]}"
one socket-LL "${SOCK[@]}" NCCL_PROTO=LL
one socket-Simple "${SOCK[@]}" NCCL_PROTO=Simple
one bagua "${BAG[@]}"
one bagua-LL "${BAG[@]}" NCCL_PROTO=LL
one bagua-Simple "${BAG[@]}" NCCL_PROTO=Simple
for c in ${BAGUA_LAT_EXTRA:-}; do
  l="${c%%:*}"; v="${c#*:}"
  # shellcheck disable=SC2086
  one "$l" "${BAG[@]}" ${v//+/ }
done
grep -h -E 'Bagua|NET/|TUNER' "$OUT"/lat-bagua.log | sed -E 's/.*NCCL INFO //' | sort -u | head -12
( cd "$OUT" && tar czf lat-logs.tgz lat-*.log && rm -f lat-*.log )
