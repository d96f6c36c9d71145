#!/usr/bin/env bash
# bagua against torch DDP, by default on ONE GPU (DDP_GPUS below): 2 ranks sharing cuda:0 through
# MPS, each rank its own NCCL_HOSTID so NCCL takes the network path (P2P and SHM off, loopback),
# with bench/ddp/compare.py:
#   1. the default path: DDP against with_bagua(gradient_allreduce), GPT-2 small (124 M, Adam,
#      512 tokens x 8 per rank) and ResNet-50 (batch 32, 224 px), over NCCL Socket
#      and over Bagua-Net (target: bagua's step time <= DDP's), and
#      gradient_allreduce_bucket_copies (CUDA buckets copied in and back: in_place_device_buckets
#      off; on by default since this comparison found the in-place buckets as fast or faster);
#   2. the slow link: every contestant (DDP, DDP + bf16 hook, DDP + PowerSGD, bagua's
#      gradient_allreduce, bytegrad, qadam, decentralized, low_precision_decentralized) over
#      Bagua-Net capped at 10 Gbit/s per rank (BAGUA_NET_SEND_RATE_MBPS) for both libraries.
# Compute is shared by the two ranks: compare contestants within one run only.
# Env from bench/gpu/run.sh: ROOT, BUILD, OUT. Detail in $OUT/80-ddp.log, JSON in $OUT/80-ddp-*.json.
# Alone: BAGUA_GPU_PHASES=steps BAGUA_GPU_STEPS=80 bench/gpu/run.sh
# step-timeout: 550
set -uo pipefail
LOG="$OUT/80-ddp.log"
PY=/opt/torch/.venv/bin/python
[ -x "$PY" ] || PY=python3
: > "$LOG"
ext_ok() { PYTHONPATH="$BUILD/python" "$PY" -c 'import _bagua_ext' >> "$LOG" 2>&1; }
if ! ext_ok; then
  echo "== building _bagua_ext for $PY" >> "$LOG"
  meson configure "$BUILD" -Dpython="$PY" >> "$LOG" 2>&1
  ninja -C "$BUILD" build.ninja >> "$LOG" 2>&1
  target=$(cd "$BUILD" && ninja -t targets all 2>/dev/null | grep -o '^python/_bagua_ext[^:]*\.so' | head -1)
  [ -n "$target" ] && timeout 90 ninja -C "$BUILD" "$target" >> "$LOG" 2>&1
fi
ext_ok || { echo "80-ddp: extension not importable by $PY (see 80-ddp.log)"; exit 1; }

# DDP_GPUS (default 1): 1 = the ranks share GPU 0 through MPS; N > 1 = N ranks, each on its own
# GPU, no MPS (the runs on 2 and 4 real GPUs; still the network path between ranks, except
# inside a --nodes group).
GPUS=${DDP_GPUS:-1}
case "$GPUS" in ''|*[!0-9]*|0) echo "80-ddp: DDP_GPUS='$GPUS': expected a GPU count >= 1"; exit 1 ;; esac
# MPS (bench/gpu/mps.sh); stopped at the end (if this step started it).
source "$ROOT/bench/gpu/mps.sh"
if [ "$GPUS" -gt 1 ]; then
  echo "80-ddp: $GPUS ranks on $GPUS GPUs (no MPS)"
elif command -v nvidia-cuda-mps-control > /dev/null; then
  start_mps "$LOG" || true
else
  echo "80-ddp: no nvidia-cuda-mps-control: ranks time-slice the GPU (collectives cost ~4.5 ms each)"
fi

if [ "$GPUS" = 1 ]; then
  export CUDA_VISIBLE_DEVICES=0
  CMP=("$PY" "$ROOT/bench/ddp/compare.py" --device cuda --nproc 2 --share-gpu --build "$BUILD")
else
  CMP=("$PY" "$ROOT/bench/ddp/compare.py" --device cuda --nproc "$GPUS" --build "$BUILD")
fi
# No plugin in the build (BAGUA_GPU_NO_BUILD, bagua installed by 85-install): the installed one.
if [ ! -f "$BUILD/net_plugin/libnccl-net.so" ]; then
  BAGUA_NET_PLUGIN_PATH=$(cd /tmp && "$PY" -c 'import bagua; print(bagua.net_plugin_path())' 2>> "$LOG")
  export BAGUA_NET_PLUGIN_PATH
  echo "80-ddp: Bagua-Net from $BAGUA_NET_PLUGIN_PATH"
fi
run() {  # label, seconds, compare.py arguments... (cut to what is left of run.sh's limit)
  local label="$1" limit="$2"; shift 2
  if [ -n "${BAGUA_STEP_DEADLINE:-}" ]; then
    local left=$(( BAGUA_STEP_DEADLINE - $(date +%s) - 5 ))
    [ "$left" -lt 60 ] && { echo "80-ddp $label: not run (step limit)"; return; }
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  echo "===== $label: $*" >> "$LOG"
  timeout "$limit" "${CMP[@]}" --timeout $((limit - 10)) --json "$OUT/80-ddp-$label.json" "$@" \
    >> "$LOG" 2>&1
  local rc=$?
  [ "$rc" = 0 ] || { echo "80-ddp $label: rc=$rc"; grep -E "Error|error|failed" "$LOG" | tail -3; }
}
SECONDS=0
# DDP_PARTS: which parts to run (default: the first two). default4: the default path with 4 ranks
# sharing the GPU; all: every contestant over Bagua-Net and over Socket, no cap; long10: the
# 10 Gbit/s link over 110 steps (the loss comparison at equal steps that the 16-20 steps of link10
# cannot make), qadam and PowerSGD warming up for 30; profile: DDP and gradient_allreduce with
# a torch.profiler block each (GPU timeline per step); hier (needs
# DDP_GPUS=4): 2 "nodes" of 2 GPUs (one NCCL_HOSTID each: NVLink inside, the network between),
# every algorithm flat against hierarchical.
PARTS=" ${DDP_PARTS:-default link10} "
if [[ "$PARTS" == *" default "* ]]; then
for net in socket bagua-net; do
  run "default-$net" 130 --net "$net" --models transformer,resnet50 \
    --contestants ddp,gradient_allreduce,gradient_allreduce_bucket_copies --rounds 6 --round-steps 5
done
fi
if [[ "$PARTS" == *" default4 "* ]]; then
  if [ "$GPUS" != 1 ] && [ "$GPUS" -lt 4 ]; then
    echo "80-ddp default4: not run (4 ranks: one shared GPU, DDP_GPUS=1, or DDP_GPUS=4)"
  else
    for net in bagua-net socket; do
      run "default4-$net" 200 --nproc 4 --net "$net" --models transformer,resnet50 \
        --contestants ddp,gradient_allreduce,gradient_allreduce_bucket_copies \
        --rounds 5 --round-steps 4
    done
  fi
fi
if [[ "$PARTS" == *" all "* ]]; then
  # Every contestant (DDP, its bf16 and PowerSGD hooks, each algorithm) over each transport, no
  # cap, on real GPUs (DDP_GPUS=2|4).
  for net in bagua-net socket; do
    run "all-$net" 260 --net "$net" --models transformer,resnet50 --rounds 5 --round-steps 4
  done
fi
if [[ "$PARTS" == *" profile "* ]]; then
  # Where gradient_allreduce's step goes against DDP's (GPT-2 above all): one more block
  # each under torch.profiler, rank 0's GPU timeline (compute, NCCL, NCCL exposed, idle).
  for net in bagua-net socket; do
    run "profile-$net" 150 --net "$net" --models transformer,resnet50 \
      --contestants ddp,gradient_allreduce --rounds 4 --round-steps 4 --profile
  done
fi
if [[ "$PARTS" == *" long10 "* ]]; then
run "long10-transformer" 420 --net bagua-net --link 10gbit --models transformer \
  --contestants ddp,ddp_bf16,ddp_powersgd,gradient_allreduce,bytegrad,qadam,low_precision_decentralized \
  --rounds 11 --round-steps 10 --algo-warmup 30
fi
if [[ "$PARTS" == *" hier "* ]]; then
  if [ "$GPUS" -ge 4 ]; then
    for net in bagua-net socket; do
      run "hier-$net" 240 --nproc 4 --nodes 2 --net "$net" --models transformer,resnet50 \
        --contestants ddp,gradient_allreduce,gradient_allreduce_hier,bytegrad,bytegrad_hier,low_precision_decentralized,low_precision_decentralized_hier \
        --rounds 5 --round-steps 4
    done
  else
    echo "80-ddp hier: not run (needs DDP_GPUS=4 on a 4-GPU machine)"
  fi
fi
if [[ "$PARTS" == *" link10 "* ]]; then
run "link10-transformer" 160 --net bagua-net --link 10gbit --models transformer \
  --rounds 4 --round-steps 4
run "link10-resnet50" 110 --net bagua-net --link 10gbit --models resnet50 \
  --rounds 4 --round-steps 5
fi

"$PY" - "$OUT" <<'PY'
import glob, json, os, sys
for path in sorted(glob.glob(os.path.join(sys.argv[1], "80-ddp-*.json"))):
    label = os.path.basename(path)[7:-5]
    for run in json.load(open(path))["runs"]:
        rows = {r["name"]: r for r in run["results"]}
        base = rows.get("ddp")
        print("{} {} ({:.1f} M): {}".format(label, run["model"], run["params"] / 1e6, run["link"]))
        for r in run["results"]:
            extra = ""
            if r["name"] == "gradient_allreduce" and "max_loss_diff_vs_ddp" in r:
                extra = " loss diff vs ddp {:.1e}".format(r["max_loss_diff_vs_ddp"])
            print("  {:32s} {:8.1f} ms {:5.2f}x  eval loss {:.3f} ({:.3f} of ddp) "
                  "rank diff {:.0e}{}".format(
                      r["name"], r["step_ms"], r.get("speed_vs_ddp", float("nan")),
                      r["eval_loss"], r["eval_loss"] / base["eval_loss"] if base else 0,
                      r["weight_spread"], extra))
            t = r.get("trace_ms_per_step")
            if t and t["buckets"] > 0:
                print("    per step ms: hooks {:.2f} finish-wait {:.2f} copy-back {:.2f} | bucket "
                      "thread: {:.1f} buckets ({} in place), queued {:.2f} copies-wait {:.2f} "
                      "comm {:.2f}".format(
                          t["mark"], t["finish_wait"], t["copy_out"], t["buckets"],
                          "{}/{}".format(*r["buckets_in_place"]) if "buckets_in_place" in r
                          else "?", t["bucket_queue"], t["bucket_wait"], t["bucket_run"]))
            p = r.get("profile")
            if p and "compute_ms" in p:
                print("    profile ms/step: wall {:.1f} compute {:.1f} nccl {:.1f} "
                      "(exposed {:.1f}) idle {:.1f}".format(
                          p["wall_ms"], p["compute_ms"], p["nccl_ms"], p["nccl_exposed_ms"],
                          p["gpu_idle_ms"]))
PY
echo "80-ddp: ${SECONDS}s"
