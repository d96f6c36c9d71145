#!/usr/bin/env bash
# Several ranks on ONE GPU: 4 (and 2) ranks sharing GPU 0 through MPS, each its own
# NCCL_HOSTID, P2P and SHM off, so NCCL's network path carries every byte over loopback. NCCL
# all-reduce busbw 1 MiB..256 MiB (bagua-nccl-bench --share-gpu, every result checked), same run:
#   socket       NCCL's Socket transport, defaults
#   socket-4x4   Socket with 4 threads x 4 sockets
#   fastsocket   Google's nccl-fastsocket (v6 plugin), built here from the sources carried in
#                third_party_fetch/fastsocket/src (tools/net_bench/fastsocket.sh), or a carried
#                third_party_fetch/fastsocket/libnccl-net-fastsocket.so
#   bagua        Bagua-Net, defaults (chunks chosen per message: BAGUA_NET_CHUNK_POLICY=adaptive);
#                at 4 ranks also, to tell causes apart: bagua-fixed (BAGUA_NET_CHUNK_POLICY=fixed:
#                the static rule, 256 KiB minimum chunk), bagua-s4 / bagua-s2 (4 and 2 streams per
#                connection: fewer helper threads per rank), bagua-c64k (BAGUA_NET_MIN_CHUNKSIZE=64K
#                pins the static rule at 64 KiB), bagua-lone64k (static rule, 64 KiB only for a
#                message posted with nothing queued), bagua-nocap (BAGUA_NET_TUNER_CHANNEL_BYTES=0:
#                NCCL's own channel count), bagua-cb8m (BAGUA_NET_TUNER_CHANNEL_BYTES=8M: fewer
#                channels, so larger ring slices, up to 32 MiB)
# then the CPU-only ring of bagua-net-bench (4 processes x 4 connections each way over loopback,
# the same streams and chunk variants, and fastsocket when built): transport throughput and CPU
# s/GB on this host's cores, the transport's own threads apart.
# plus the CPU time of all ranks (user + system, bash `times` of the finished run) per GB the
# ranks sent (2(n-1) x size per all-reduce, warm-up included).
# Detail in $OUT/16-net-ranks.log and $OUT/ranks<N>-<label>.json; tables on stdout.
# Alone: BAGUA_GPU_PHASES=steps BAGUA_GPU_STEPS=16 bench/gpu/run.sh
# step-timeout: 590
set -uo pipefail
LOG="$OUT/16-net-ranks.log"
BENCH="$BUILD/tools/nccl_bench/bagua-nccl-bench"
: > "$LOG"
FS="$BUILD/fastsocket/libnccl-net-fastsocket.so"
if [ ! -f "$FS" ] && [ -f "$ROOT/third_party_fetch/fastsocket/src/net_fastsocket.cc" ]; then
  "$ROOT/tools/net_bench/fastsocket.sh" build "$ROOT/third_party_fetch/fastsocket/src" \
    "$BUILD/fastsocket" >> "$LOG" 2>&1 || echo "16-net-ranks: fastsocket build failed (see the log)"
fi
[ -f "$FS" ] || FS="$ROOT/third_party_fetch/fastsocket/libnccl-net-fastsocket.so"
[ -x "$BENCH" ] || { echo "16-net-ranks: bagua-nccl-bench not built"; exit 1; }

source "$ROOT/bench/gpu/mps.sh"
start_mps "$LOG" ||
  echo "16-net-ranks: MPS not started (ranks time-slice the GPU: compare within this run only)"

NETPATH=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1
         NCCL_NVLS_ENABLE=0 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET)
# CPU_NOW = user+system seconds of this shell's finished children so far. `times` must run in
# this shell itself (a pipeline or $(...) would be a fresh process with no children).
TIMES_FILE="$OUT/.16-times"
cpu_children() {
  times > "$TIMES_FILE"
  CPU_NOW=$(tail -1 "$TIMES_FILE" | awk '{ split($1, u, /[ms]/); split($2, s, /[ms]/); print u[1] * 60 + u[2] + s[1] * 60 + s[2] }')
}
CPU_TABLE="$OUT/16-net-ranks-cpu.txt"
: > "$CPU_TABLE"
# NET_RANKS_SKIP: an extended regex over "ranks<N>-<label>" of runs to leave out (for repeats of
# a few cases, e.g. '^ranks4-(socket-4x4|fastsocket)$'); NET_RANKS_RING=0 leaves out the ring.
run() {  # ranks, label, env assignments...
  local n="$1" label="$2"; shift 2
  local before after
  if [ -n "${NET_RANKS_SKIP:-}" ] && grep -qE "$NET_RANKS_SKIP" <<< "ranks$n-$label"; then
    echo "  ranks $n $label: left out (NET_RANKS_SKIP)"
    return
  fi
  cpu_children
  before=$CPU_NOW
  echo "===== ranks $n $label: $*" >> "$LOG"
  env "${NETPATH[@]}" "$@" timeout 150 "$BENCH" --ranks "$n" --share-gpu --min 1M --max 256M \
    --iters 10 --warmup 3 --label "ranks$n-$label" --json "$OUT/ranks$n-$label.json" >> "$LOG" 2>&1
  local rc=$?
  cpu_children
  after=$CPU_NOW
  grep -oE 'Loaded net plugin [A-Za-z]+ \(v[0-9]+\)|Using network [A-Za-z]+' "$LOG" | tail -1 |
    sed "s/^/  ranks $n $label: /"
  [ "$rc" = 0 ] || echo "  ranks $n $label: rc=$rc"
  echo "$n $label $before $after" >> "$CPU_TABLE"
}
PLUG=(LD_LIBRARY_PATH="$PLUGIN_DIR:${LD_LIBRARY_PATH:-}" NCCL_NET_PLUGIN=bagua NCCL_NET=Bagua)
# NET_RANKS_N: the rank counts (default "4 2"). NET_RANKS_VARIANTS4 default: fixed (the static
# chunk rule), s4 / s2 (4 and 2 streams), c64k (64 KiB chunks), lone64k (64 KiB chunks only for a
# message posted with nothing queued), nocap / cb8m (the tuner's channel cap off / at 8 MiB), i512k
# (messages up to 512 KiB inline on the control stream: no helper threads, one flow).
NS="${NET_RANKS_N:-4 2}"
VARIANTS4="${NET_RANKS_VARIANTS4-fixed:BAGUA_NET_CHUNK_POLICY=fixed s4:BAGUA_NET_NSTREAMS=4 \
s2:BAGUA_NET_NSTREAMS=2 c64k:BAGUA_NET_MIN_CHUNKSIZE=64K lone64k:BAGUA_NET_LONE_CHUNKSIZE=64K \
nocap:BAGUA_NET_TUNER_CHANNEL_BYTES=0 \
cb8m:BAGUA_NET_TUNER_CHANNEL_BYTES=8M i512k:BAGUA_NET_INLINE_BYTES=512K}"
for n in $NS; do
  run "$n" socket NCCL_NET_PLUGIN=none NCCL_NET=Socket
  run "$n" socket-4x4 NCCL_NET_PLUGIN=none NCCL_NET=Socket NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4
  if [ -f "$FS" ]; then
    run "$n" fastsocket NCCL_NET_PLUGIN="$FS" NCCL_NET=FastSocket
  else
    echo "  fastsocket: not built ($FS missing): left out"
  fi
  run "$n" bagua "${PLUG[@]}"
  # The variants, "label:VAR=value[,VAR=value...]" words: NET_RANKS_VARIANTS4 at 4 ranks,
  # NET_RANKS_VARIANTS2 at 2 (default none).
  if [ "$n" = 4 ]; then variants="$VARIANTS4"; else variants="${NET_RANKS_VARIANTS2:-}"; fi
  for v in $variants; do
    IFS=, read -r -a venv <<< "${v#*:}"
    run "$n" "bagua-${v%%:*}" "${PLUG[@]}" "${venv[@]}"
  done
done

for n in $NS; do
  labels=()
  for l in socket socket-4x4 fastsocket bagua $(for v in $VARIANTS4 ${NET_RANKS_VARIANTS2:-}; do
      echo "bagua-${v%%:*}"; done | sort -u); do
    [ -f "$OUT/ranks$n-$l.json" ] && labels+=("ranks$n-$l")
  done
  echo "--- $n ranks on one GPU (busbw GB/s, ratios against Socket)"
  python3 "$ROOT/bench/gpu/summarize.py" "$OUT" "${labels[@]}" | tee "$OUT/16-net-ranks$n.md"
done
echo "--- CPU seconds (all ranks, user + system) per GB sent"
python3 - "$OUT" "$CPU_TABLE" <<'PY'
import json, os, sys
out, table = sys.argv[1], sys.argv[2]
for line in open(table):
    n, label, before, after = line.split()
    n, cpu = int(n), float(after) - float(before)
    try:
        rows = json.load(open(os.path.join(out, f"ranks{n}-{label}.json")))["rows"]
    except (OSError, ValueError, KeyError):
        continue
    gb = sum((10 + 3) * 2 * (n - 1) * r["bytes"] for r in rows) / 1e9
    print(f"  ranks {n} {label:11s} {cpu:7.1f} s CPU for {gb:6.1f} GB: {cpu / gb:.3f} s/GB")
PY

[ "${NET_RANKS_RING:-1}" = 0 ] && exit 0
echo "--- CPU-only ring: 4 processes x 4 connections each way, loopback (bagua-net-bench --ring)"
RING="$BUILD/tools/net_bench/bagua-net-bench"
RING_CASES=socket,bagua:8,bagua:4,bagua:2
[ -f "$FS" ] && RING_CASES="$RING_CASES,fastsocket@$FS"
for e in "" BAGUA_NET_CHUNK_POLICY=fixed BAGUA_NET_MIN_CHUNKSIZE=64K; do
  echo "  ${e:-defaults}"
  tag=${e//=/-}
  env $e timeout 120 "$RING" --plugin "$PLUGIN_DIR/libnccl-net.so" \
    --ring 4 --channels 4 --sizes 128K,512K,2M --cases "$RING_CASES" \
    --bytes 256M --json "$OUT/16-ring${tag:+-$tag}.json" >> "$LOG" 2>&1 || echo "  ring rc=$?"
  python3 -c 'import json,sys
for r in json.load(open(sys.argv[1]))["results"]:
    print("    %7d %-8s %6.2f GB/s %6.3f CPU s/GB (plugin threads %6.3f)" % (r["size"], r["case"], r["GBps"], r["cpu_s_per_GB"], r["plugin_cpu_s_per_GB"]))' \
    "$OUT/16-ring${tag:+-$tag}.json" 2>/dev/null
done
