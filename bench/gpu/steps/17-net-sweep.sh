#!/usr/bin/env bash
# The network-path all-reduce sweep, nccl-tests style: float sum 8 KiB .. 1 GiB at 2 and 4 real
# GPUs (one rank a GPU, each its own NCCL_HOSTID, LOCAL_RANK=0; NCCL_P2P_DISABLE=1
# NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0: every byte crosses loopback TCP),
# in one run:
#   socket       NCCL's Socket transport, defaults
#   socket-4x4   Socket with 4 threads x 4 sockets
#   fastsocket   Google's nccl-fastsocket (v6 plugin), built here from the sources carried in
#                third_party_fetch/fastsocket/src (tools/net_bench/fastsocket.sh stage), or a
#                carried third_party_fetch/fastsocket/libnccl-net-fastsocket.so
#   bagua        Bagua-Net, defaults (and NET_SWEEP_VARIANTS, "label:VAR=value[,VAR=value]" words,
#                e.g. "fixed:BAGUA_NET_CHUNK_POLICY=fixed cb1m:BAGUA_NET_TUNER_CHANNEL_BYTES=1M")
# every result checked (bagua-nccl-bench --own-host), with the CPU seconds of the ranks' threads
# (all but the launching one: NCCL's proxies and the plugin's own) per GB sent, and after Bagua-Net
# at each rank count the host's ceiling for a TCP transport: the same rank processes move the same
# bytes over 4 and 8 plain TCP sockets per neighbour with no NCCL (bagua-nccl-bench --tcp-ceiling).
# Tables on stdout (bench/gpu/summarize.py --sweep), detail in $OUT/17-net-sweep.log and
# $OUT/sweep<N>-<label>.json. NET_SWEEP_SHARE=1: a rank count above the machine's GPUs runs with
# every rank on GPU 0 under MPS (bagua-nccl-bench --share-gpu), the one-GPU method: the bytes take
# the same loopback path, while the ranks' reduction kernels share one GPU. About 3 minutes on 4
# H100 (NET_SWEEP_N="2 4"); needs only bagua-nccl-bench and the plugin built (a first call builds
# them, this one runs):
#   BAGUA_GPU_NO_BUILD=1 BAGUA_GPU_PHASES=steps BAGUA_GPU_STEPS=17 bench/gpu/run.sh
# step-timeout: 480
set -uo pipefail
LOG="$OUT/17-net-sweep.log"
BENCH="$BUILD/tools/nccl_bench/bagua-nccl-bench"
: > "$LOG"
[ -x "$BENCH" ] || { echo "17-net-sweep: bagua-nccl-bench not built"; exit 1; }
[ -f "$PLUGIN_DIR/libnccl-net.so" ] || { echo "17-net-sweep: the plugin not built"; exit 1; }

# fastsocket: built here (outside the timed runs) from carried sources, else a carried build.
FS="$BUILD/fastsocket/libnccl-net-fastsocket.so"
if [ ! -f "$FS" ] && [ -f "$ROOT/third_party_fetch/fastsocket/src/net_fastsocket.cc" ]; then
  "$ROOT/tools/net_bench/fastsocket.sh" build "$ROOT/third_party_fetch/fastsocket/src" \
    "$BUILD/fastsocket" >> "$LOG" 2>&1 || echo "  fastsocket: build failed (see the log)"
fi
[ -f "$FS" ] || FS="$ROOT/third_party_fetch/fastsocket/libnccl-net-fastsocket.so"

GPUS=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU')
NETPATH=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1
         NCCL_NVLS_ENABLE=0 LOCAL_RANK=0 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET)
# Sizes from 8 KiB to 1 GiB; a size runs max(5, min(50, 2 GiB / size)) timed iterations.
SWEEP=(--own-host --min 8K --max 1G --iters 50 --warmup 3 --iter-bytes 2G)
PLUG=(LD_LIBRARY_PATH="$PLUGIN_DIR:${LD_LIBRARY_PATH:-}" NCCL_NET_PLUGIN=bagua NCCL_NET=Bagua)
run() {  # ranks, label, extra bench arguments (up to --), env assignments...
  local n="$1" label="$2"; shift 2
  local extra=()
  while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do extra+=("$1"); shift; done
  [ "$#" -gt 0 ] && shift
  echo "===== ranks $n $label: $* ${extra[*]}" >> "$LOG"
  local t0=$SECONDS
  env "${NETPATH[@]}" "$@" timeout 200 "$BENCH" --ranks "$n" "${SWEEP[@]}" "${SHARE[@]}" "${extra[@]}" \
    --label "sweep$n-$label" --json "$OUT/sweep$n-$label.json" >> "$LOG" 2>&1
  local rc=$?
  local loaded
  loaded=$(sed -n "/^===== ranks $n $label:/,\$p" "$LOG" |
    grep -oE 'Loaded net plugin [A-Za-z]+ \(v[0-9]+\)|Using network [A-Za-z]+' | tail -1)
  echo "  ranks $n $label: ${loaded:-?}, $((SECONDS - t0)) s$([ "$rc" = 0 ] || echo ", rc=$rc")"
}
# NET_SWEEP_PEERS: the peers to run (default all three; a call comparing Bagua-Net variants
# alone may leave them out, e.g. NET_SWEEP_PEERS=fastsocket).
PEERS="${NET_SWEEP_PEERS-socket socket-4x4 fastsocket}"
SHARE=()
for n in ${NET_SWEEP_N:-2 4}; do
  if [ "$GPUS" -lt "$n" ] && [ "${NET_SWEEP_SHARE:-0}" = 1 ]; then
    if [ ${#SHARE[@]} = 0 ]; then
      source "$ROOT/bench/gpu/mps.sh"
      start_mps "$LOG" ||
        { echo "17-net-sweep: MPS did not start: ranks sharing a GPU would wait ~4.5 ms a collective"; exit 1; }
    fi
    SHARE=(--share-gpu)
    echo "  ranks $n: every rank on GPU 0 under MPS ($GPUS GPU(s) here)"
  elif [ "$GPUS" -lt "$n" ]; then
    echo "  ranks $n: left out ($GPUS GPUs here; NET_SWEEP_SHARE=1 shares one)"
    continue
  fi
  if [[ " $PEERS " == *" socket "* ]]; then
    run "$n" socket -- NCCL_NET_PLUGIN=none NCCL_NET=Socket
  fi
  if [[ " $PEERS " == *" socket-4x4 "* ]]; then
    run "$n" socket-4x4 -- NCCL_NET_PLUGIN=none NCCL_NET=Socket NCCL_SOCKET_NTHREADS=4 \
      NCCL_NSOCKS_PERTHREAD=4
  fi
  if [[ " $PEERS " == *" fastsocket "* ]] && [ -f "$FS" ]; then
    run "$n" fastsocket -- NCCL_NET_PLUGIN="$FS" NCCL_NET=FastSocket
  elif [[ " $PEERS " == *" fastsocket "* ]]; then
    echo "  fastsocket: neither sources nor a build carried in third_party_fetch/fastsocket: left out"
  fi
  for v in ${NET_SWEEP_VARIANTS:-}; do
    IFS=, read -r -a venv <<< "${v#*:}"
    run "$n" "bagua-${v%%:*}" -- "${PLUG[@]}" "${venv[@]}"
  done
  run "$n" bagua --tcp-ceiling 4,8 --tcp-min 64M -- "${PLUG[@]}"
done
python3 "$ROOT/bench/gpu/summarize.py" --sweep "$OUT" | tee "$OUT/17-net-sweep.md"
