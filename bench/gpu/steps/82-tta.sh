#!/usr/bin/env bash
# Time to accuracy on GPUs (bench/ddp/compare.py --tta): every contestant (torch DDP, its bf16
# and PowerSGD hooks at ranks 1 and 4, our six algorithms, our powersgd at ranks 1 and 4 and at
# rank 16 with 8-bit factors where it is registered, auto) trains from the same weights on the
# same batches until the evaluation metric reaches the target, or the step cap; one rank per GPU.
#
# One cell per call, chosen by the environment (each call <= 8 minutes on a warm machine):
#   TTA_MODEL  transformer | resnet50                                    (default transformer)
#   TTA_LINK   (required: without it the step does nothing)
#              nvlink      NCCL inside the host, P2P over NVLink, no cap
#              net         NCCL's network path over Bagua-Net, no cap (P2P and SHM off)
#              10gbit | 1gbit   the network path with Bagua-Net's send-rate cap per rank
#                          (BAGUA_NET_SEND_RATE_MBPS, for every contestant)
#   TTA_GPUS   2 | 4: ranks, one a GPU                                    (default 4)
#   TTA_SHARE_GPU=1  every rank on GPU 0 under MPS (compare.py --share-gpu), for a machine with
#              fewer GPUs than ranks: the network path only (not nvlink); the ranks' compute
#              shares one GPU, so step times are not those of one rank a GPU, while the metric
#              at a step (and so steps to target and the metric at the cap) is the same
#   TTA_MAX_STEPS, TTA_CONTESTANTS, TTA_EXTRA (more compare.py arguments): override the cell's
#   defaults below.
#   TTA_PRESET  the model's preset (default: mid for the LM, small for the ResNet); gpt2-chain is
#              GPT-2 small itself (124 M parameters, 500 MB of gradients) on a 256-token chain,
#              Adam lr TTA_LR (default 6e-4 for it) after a linear warm-up of TTA_LR_WARMUP steps
#              (default 50 for it, else 0), target 0.5 nats above the floor, 300 steps
#   TTA_LM_MARGIN=from-ddp  the LM's target margin is measured first: DDP alone over NVLink (the
#              same weights, batches and steps; no cap, so it is quick) to the step cap, and the
#              margin is its eval loss at 60% of the cap above the chain's floor, rounded up to
#              0.05 nats: a target DDP reaches inside the cap by construction.
# Models (sized so that a cell fits its call; bench/ddp/README.md, "Time to accuracy"):
#   transformer: preset mid, GPT-2's layout at 4 layers, width 256, on a 256-token Markov
#                chain, 128-token context (3.3 M parameters, 13 MB of gradients), 16 sequences
#                per rank; target: eval loss within 0.35 nats of the chain's loss floor
#   resnet50:    preset small, ResNet-50's bottleneck layout at width 16 (a quarter of
#                ResNet-50's) on 64-pixel images of 10 classes (1.5 M parameters), 32 images
#                per rank; target: 95% top-1 on held-out images
# Adam lr 2e-3 (transformer) / 5e-3 (resnet50); PowerSGD's start iteration (torch's hook and
# ours), QAdam's and async's warm-up: a tenth of the step cap.
#
#   BAGUA_GPU_PHASES=steps BAGUA_GPU_STEPS=82 TTA_MODEL=resnet50 TTA_LINK=1gbit bench/gpu/run.sh
# Env from bench/gpu/run.sh: ROOT, BUILD, OUT. Detail in $OUT/82-tta.log; per cell
# $OUT/82-tta-<model>-<link>-<gpus>g.json (every evaluation) and .png (metric against wall time).
# step-timeout: 500
set -uo pipefail
# A cell takes minutes: only when asked for (a full run.sh passes by).
[ -n "${TTA_LINK:-}" ] || { echo "82-tta: not run (set TTA_LINK, and TTA_MODEL / TTA_GPUS)"; exit 0; }
LOG="$OUT/82-tta.log"
PY=/opt/torch/.venv/bin/python
[ -x "$PY" ] || PY=python3
touch "$LOG"
ext_ok() { PYTHONPATH="$BUILD/python" "$PY" -c 'import _bagua_ext' >> "$LOG" 2>&1; }
if ! ext_ok; then
  echo "== building _bagua_ext for $PY" >> "$LOG"
  meson configure "$BUILD" -Dpython="$PY" >> "$LOG" 2>&1
  ninja -C "$BUILD" build.ninja >> "$LOG" 2>&1
  target=$(cd "$BUILD" && ninja -t targets all 2>/dev/null | grep -o '^python/_bagua_ext[^:]*\.so' | head -1)
  [ -n "$target" ] && timeout 120 ninja -C "$BUILD" "$target" >> "$LOG" 2>&1
fi
ext_ok || { echo "82-tta: extension not importable by $PY (see 82-tta.log)"; exit 1; }
"$PY" -c 'import matplotlib' 2> /dev/null ||
  echo "82-tta: no matplotlib for $PY: no PNG here (bench/ddp/tta_report.py JSON --plot PREFIX draws it)"

MODEL=${TTA_MODEL:-transformer}
LINK=$TTA_LINK
GPUS=${TTA_GPUS:-4}
case "$MODEL" in transformer|resnet50) ;; *) echo "82-tta: TTA_MODEL='$MODEL': transformer or resnet50"; exit 1 ;; esac
case "$GPUS" in 2|4) ;; *) echo "82-tta: TTA_GPUS='$GPUS': 2 or 4"; exit 1 ;; esac
have=$(nvidia-smi -L 2> /dev/null | wc -l)
SHARE=()
if [ "${TTA_SHARE_GPU:-0}" = 1 ]; then
  [ "$LINK" != nvlink ] || { echo "82-tta: TTA_SHARE_GPU=1 takes the network path: not TTA_LINK=nvlink"; exit 1; }
  [ "${TTA_LM_MARGIN:-}" != from-ddp ] || { echo "82-tta: TTA_LM_MARGIN=from-ddp runs over NVLink: not with TTA_SHARE_GPU=1"; exit 1; }
  SHARE=(--share-gpu)
  source "$ROOT/bench/gpu/mps.sh"
  start_mps "$LOG" || { echo "82-tta: MPS did not start (every collective would wait ~4.5 ms)"; exit 1; }
elif [ "$have" -lt "$GPUS" ]; then
  echo "82-tta: TTA_GPUS=$GPUS but this machine has $have GPU(s) (TTA_SHARE_GPU=1 shares one)"; exit 1
fi
case "$LINK" in
  nvlink) NET=(--net nvlink) ;;
  net) NET=(--net bagua-net) ;;
  10gbit|1gbit) NET=(--net bagua-net --link "$LINK") ;;
  *) echo "82-tta: TTA_LINK='$LINK': nvlink, net, 10gbit or 1gbit"; exit 1 ;;
esac
# The cell's defaults: step caps that every contestant runs to (the metric at the cap), sized
# from the slowest contestants' step time on that link.
if [ "$MODEL" = transformer ]; then
  PRESET=${TTA_PRESET:-mid}
  LR=2e-3 WARM=0 MARGIN=0.35
  case "$LINK" in 1gbit) STEPS=200 ;; *) STEPS=250 ;; esac
  # GPT-2 small from scratch stays on the chain's unigram plateau for hundreds of steps at a
  # constant rate; a 50-step linear warm-up to 6e-4 brings it within 0.5 nats of the floor in
  # about 225 steps at 16 sequences a step (bench/ddp/lr_probe.py on one H200).
  [ "$PRESET" = gpt2-chain ] && { LR=6e-4 WARM=50 MARGIN=0.5 STEPS=300; }
  ARGS=(--preset "$PRESET" --lr "${TTA_LR:-$LR}" --lr-warmup "${TTA_LR_WARMUP:-$WARM}"
        --lm-margin "$MARGIN")
else
  ARGS=(--preset "${TTA_PRESET:-small}" --batch 32 --lr "${TTA_LR:-5e-3}" --target-acc 95)
  case "$LINK" in 1gbit) STEPS=160 ;; *) STEPS=200 ;; esac
fi
STEPS=${TTA_MAX_STEPS:-$STEPS}
CONT=()
[ -n "${TTA_CONTESTANTS:-}" ] && CONT=(--contestants "$TTA_CONTESTANTS")
read -r -a EXTRA <<< "${TTA_EXTRA:-}"
# No plugin in the build (BAGUA_GPU_NO_BUILD): the installed one.
if [ ! -f "$BUILD/net_plugin/libnccl-net.so" ]; then
  BAGUA_NET_PLUGIN_PATH=$(cd /tmp && "$PY" -c 'import bagua; print(bagua.net_plugin_path())' 2>> "$LOG")
  export BAGUA_NET_PLUGIN_PATH
fi
LABEL="$MODEL-$LINK-${GPUS}g$([ ${#SHARE[@]} = 0 ] || echo -shared)"
LIMIT=480
if [ -n "${BAGUA_STEP_DEADLINE:-}" ]; then
  left=$(( BAGUA_STEP_DEADLINE - $(date +%s) - 10 ))
  [ "$left" -lt "$LIMIT" ] && LIMIT=$left
fi
[ "$LIMIT" -ge 60 ] || { echo "82-tta $LABEL: not run (step limit)"; exit 1; }
SECONDS=0
if [ "$MODEL" = transformer ] && [ "${TTA_LM_MARGIN:-}" = from-ddp ]; then
  echo "===== $LABEL: the margin from DDP over NVLink: ${ARGS[*]} --max-steps $STEPS" >> "$LOG"
  timeout "$LIMIT" "$PY" "$ROOT/bench/ddp/compare.py" --tta --device cuda --nproc "$GPUS" \
    --build "$BUILD" --models "$MODEL" "${ARGS[@]}" --max-steps "$STEPS" --net nvlink \
    --contestants ddp "${EXTRA[@]}" --timeout $((LIMIT - 15)) \
    --json "$OUT/82-tta-$LABEL-margin.json" > "$OUT/82-tta-$LABEL-margin.log" 2>&1
  margin=$("$PY" - "$OUT/82-tta-$LABEL-margin.json" << 'EOF'
import json, math, sys
run = next(r for r in json.load(open(sys.argv[1]))["runs"] if r.get("mode") == "tta")
evals = run["results"][0]["evals"]
at = max(e[0] for e in evals) * 0.6
loss = min((abs(e[0] - at), e[2]) for e in evals)[1]
print("{:.2f}".format(math.ceil((loss - run["task"]["floor"]) / 0.05) * 0.05))
EOF
  )
  [ -n "$margin" ] || { echo "82-tta $LABEL: no margin from the DDP run (see $OUT/82-tta-$LABEL-margin.log)"; exit 1; }
  echo "82-tta $LABEL: margin $margin nats (DDP's eval loss at 60% of $STEPS steps over NVLink), ${SECONDS}s"
  ARGS+=(--lm-margin "$margin")
  LIMIT=$((LIMIT - SECONDS))
fi
echo "===== $LABEL: ${ARGS[*]} --max-steps $STEPS ${NET[*]}" >> "$LOG"
timeout "$LIMIT" "$PY" "$ROOT/bench/ddp/compare.py" --tta --device cuda --nproc "$GPUS" \
  --build "$BUILD" --models "$MODEL" "${ARGS[@]}" --max-steps "$STEPS" "${NET[@]}" \
  "${SHARE[@]}" "${CONT[@]}" "${EXTRA[@]}" --timeout $((LIMIT - 15)) \
  --json "$OUT/82-tta-$LABEL.json" --plot "$OUT/82-tta-$LABEL" > "$OUT/82-tta-$LABEL.log" 2>&1
rc=$?
cat "$OUT/82-tta-$LABEL.log" >> "$LOG"
# The table (and auto's choice) on stdout; run.sh keeps the last 40 lines.
sed -n '/^time to accuracy:/,$p' "$OUT/82-tta-$LABEL.log" | grep -v '^plot:'
[ "$rc" = 0 ] || { echo "82-tta $LABEL: rc=$rc"; grep -E "Error|error|failed" "$OUT/82-tta-$LABEL.log" | tail -4; }
[ -f "$OUT/82-tta-$LABEL-$MODEL.png" ] && mv "$OUT/82-tta-$LABEL-$MODEL.png" "$OUT/82-tta-$LABEL.png"
echo "82-tta $LABEL: ${SECONDS}s"
exit "$rc"
