#!/usr/bin/env bash
# The default path against torch DDP with the optimizer overlapped (bench/ddp/compare.py), on
# OVERLAP_GPUS GPUs of this host (default: every visible one, at least 2), one rank a GPU,
# AdamW, GPT-2 small (124 M, 512 tokens x 8 a rank) and ResNet-50 (batch 32, 224 px), over each
# link in turn:
#   nvlink     one "node" (compare.py --nodes 1): NCCL between the GPUs of the host (NVLink)
#   bagua-net  the network path (P2P and SHM off, loopback) over Bagua-Net
#   socket     the network path over NCCL's Socket transport
# Contestants, interleaved round by round in the same ranks:
#   ddp_fused                       torch DDP + torch's fused AdamW (fused=True)
#   gradient_allreduce_fused        with_bagua + fuse_optimizer(AdamW(fused=True)): each bucket
#                                   stepped inside the backward pass (the default)
#   gradient_allreduce_fused_after  the same, stepped after backward (what the overlap gives)
#   ddp, gradient_allreduce         the same two without a fused optimizer (AdamW's foreach)
# plus compare.py --profile: per contestant and step, compute, exposed communication, optimizer
# and GPU idle from rank 0's kernel timeline. The table the lead puts in bench/RESULTS.md is
# printed at the end (speed against ddp_fused, and against ddp for the unfused pair).
# One device call per GPU count: OVERLAP_GPUS=2 on a 2-GPU machine, OVERLAP_GPUS=4 on a 4-GPU one:
#   BAGUA_GPU_PHASES=steps BAGUA_GPU_STEPS=81 OVERLAP_GPUS=2 bench/gpu/run.sh
# OVERLAP_LINKS (default "nvlink bagua-net socket") and OVERLAP_MODELS (default
# "transformer,resnet50") cut a call shorter.
# Env from bench/gpu/run.sh: ROOT, BUILD, OUT. Detail in $OUT/81-overlap.log, JSON in
# $OUT/81-overlap-*.json.
# step-timeout: 420
set -uo pipefail
LOG="$OUT/81-overlap.log"
PY=/opt/torch/.venv/bin/python
[ -x "$PY" ] || PY=python3
: > "$LOG"
ext_ok() { PYTHONPATH="$BUILD/python" "$PY" -c 'import _bagua_ext' >> "$LOG" 2>&1; }
if ! ext_ok; then
  echo "== building _bagua_ext for $PY" >> "$LOG"
  meson configure "$BUILD" -Dpython="$PY" >> "$LOG" 2>&1
  ninja -C "$BUILD" build.ninja >> "$LOG" 2>&1
  target=$(cd "$BUILD" && ninja -t targets all 2>/dev/null |
           grep -o '^python/_bagua_ext[^:]*\.so' | head -1)
  [ -n "$target" ] && timeout 120 ninja -C "$BUILD" "$target" >> "$LOG" 2>&1
fi
ext_ok || { echo "81-overlap: extension not importable by $PY (see 81-overlap.log)"; exit 1; }

VISIBLE=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
GPUS=${OVERLAP_GPUS:-$VISIBLE}
case "$GPUS" in
  ''|*[!0-9]*) echo "81-overlap: OVERLAP_GPUS='$GPUS': expected a GPU count"; exit 1 ;;
esac
if [ "$GPUS" -lt 2 ] || [ "$GPUS" -gt "$VISIBLE" ]; then
  echo "81-overlap: needs 2 or more GPUs and at most the $VISIBLE visible (OVERLAP_GPUS=$GPUS)"
  exit 1
fi
if [ ! -f "$BUILD/net_plugin/libnccl-net.so" ]; then
  BAGUA_NET_PLUGIN_PATH=$(cd /tmp &&
                          "$PY" -c 'import bagua; print(bagua.net_plugin_path())' 2>> "$LOG")
  export BAGUA_NET_PLUGIN_PATH
fi
CONTESTANTS=ddp_fused,gradient_allreduce_fused,gradient_allreduce_fused_after
CONTESTANTS+=,ddp,gradient_allreduce
CMP=("$PY" "$ROOT/bench/ddp/compare.py" --device cuda --nproc "$GPUS" --build "$BUILD"
     --optimizer adamw --profile --contestants "$CONTESTANTS")
MODELS=${OVERLAP_MODELS:-transformer,resnet50}
ROUNDS="--rounds 5 --round-steps 4"
run() {  # label, seconds, compare.py arguments... (cut to what is left of run.sh's limit)
  local label="$1" limit="$2"; shift 2
  if [ -n "${BAGUA_STEP_DEADLINE:-}" ]; then
    local left=$(( BAGUA_STEP_DEADLINE - $(date +%s) - 15 ))
    [ "$left" -lt 60 ] && { echo "81-overlap $label: not run (step limit)"; return; }
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  echo "===== $label: $*" >> "$LOG"
  timeout "$limit" "${CMP[@]}" --timeout $((limit - 10)) --json "$OUT/81-overlap-$label.json" \
    "$@" >> "$LOG" 2>&1
  local rc=$?
  [ "$rc" = 0 ] || { echo "81-overlap $label: rc=$rc"; grep -E "Error|error|failed" "$LOG" |
                     tail -3; }
}
SECONDS=0
for link in ${OVERLAP_LINKS:-nvlink bagua-net socket}; do
  case "$link" in
    nvlink) run "$GPUS-nvlink" 130 --nodes 1 --net socket --models "$MODELS" $ROUNDS ;;
    bagua-net) run "$GPUS-bagua-net" 130 --net bagua-net --models "$MODELS" $ROUNDS ;;
    socket) run "$GPUS-socket" 170 --net socket --models "$MODELS" $ROUNDS ;;
    *) echo "81-overlap: unknown link '$link' (nvlink, bagua-net, socket)" ;;
  esac
done

"$PY" - "$OUT" "$GPUS" <<'PY'
import glob, json, math, os, sys
out, gpus = sys.argv[1], sys.argv[2]
pairs = [("gradient_allreduce_fused", "ddp_fused"),
         ("gradient_allreduce_fused_after", "ddp_fused"), ("gradient_allreduce", "ddp")]
ratios = {p: [] for p in pairs}
print("81-overlap, {} GPUs: speed = the peer's step time / bagua's, same run (> 1: bagua faster)"
      .format(gpus))
for path in sorted(glob.glob(os.path.join(out, "81-overlap-{}-*.json".format(gpus)))):
    label = os.path.basename(path)[len("81-overlap-"):-5]
    for run in json.load(open(path))["runs"]:
        rows = {r["name"]: r for r in run["results"]}
        cells = []
        for ours, peer in pairs:
            if ours in rows and peer in rows:
                a, b = rows[ours], rows[peer]
                pr = sorted(x / y for x, y in zip(b["round_ms"], a["round_ms"]) if y > 0)
                h = len(pr) // 2
                mid = pr[h] if len(pr) % 2 else 0.5 * (pr[h - 1] + pr[h])
                ratios[(ours, peer)].append(mid)
                cells.append("{} {:.1f} ms vs {} {:.1f}: {:.3f}x".format(
                    ours, a["step_ms"], peer, b["step_ms"], mid))
        print("{} {}: {}".format(label, run["model"], "; ".join(cells)))
        for r in run["results"]:
            p = r.get("profile")
            if p and "compute_ms" in p:
                print("    {:32s} profile ms/step: wall {:.1f} compute {:.1f} exposed comm {:.1f} "
                      "optimizer {:.1f} GPU idle {:.1f}".format(
                          r["name"], p["wall_ms"], p["compute_ms"], p["nccl_exposed_ms"],
                          p.get("optimizer_ms", float("nan")), p["gpu_idle_ms"]))
        diff = rows.get("gradient_allreduce_fused", {}).get("max_loss_diff_vs_ddp")
        if diff is not None:
            print("    largest per-step loss difference, gradient_allreduce_fused vs ddp: "
                  "{:.1e}".format(diff))
for (ours, peer), v in ratios.items():
    if v:
        g = math.exp(sum(math.log(x) for x in v) / len(v))
        print("geometric mean {} / {} over {} cells: {:.3f}x (lowest {:.3f}x)".format(
            ours, peer, len(v), g, min(v)))
PY
echo "81-overlap: ${SECONDS}s"
