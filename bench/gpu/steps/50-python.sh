#!/usr/bin/env bash
# The PyTorch front end on 2 GPUs: the extension for the venv's Python (torch 2.11),
# the pytest suite (CPU tests, then CUDA tensors + NCCL in test_gpu.py, the Lightning strategy on
# GPUs), and step time of bagua's DDP against torch DDP on the same model in the same run.
# Env from bench/gpu/run.sh: ROOT, BUILD, OUT. Detail in $OUT/python.log.
set -uo pipefail
LOG="$OUT/python.log"
PY=/opt/torch/.venv/bin/python
: > "$LOG"
[ -x "$PY" ] || { echo "no $PY: python step skipped"; exit 0; }
ext_ok() { PYTHONPATH="$BUILD/python" "$PY" -c 'import _bagua_ext' >> "$LOG" 2>&1; }
if ! ext_ok; then
  # The lead's build picked another interpreter (or none): build the extension for the venv.
  echo "== building _bagua_ext for $PY" >> "$LOG"
  meson configure "$BUILD" -Dpython="$PY" >> "$LOG" 2>&1
  ninja -C "$BUILD" build.ninja >> "$LOG" 2>&1   # regenerate now, so the target list is current
  target=$(cd "$BUILD" && ninja -t targets all 2>/dev/null | grep -o '^python/_bagua_ext[^:]*\.so' | head -1)
  [ -n "$target" ] && timeout 90 ninja -C "$BUILD" "$target" >> "$LOG" 2>&1
fi
if ! ext_ok; then
  echo "extension not importable by $PY (see python.log):"
  grep -iE "python front end|extension|error" "$LOG" | tail -5
  exit 1
fi
export PYTHONPATH="$ROOT/python:$BUILD/python"
export BAGUA_TEST_BAGUARUN="$BUILD/tools/baguarun/baguarun"
export BAGUA_TEST_ACCELERATOR=gpu
echo "extension: $("$PY" -c 'import _bagua_ext as e, torch; print("torch", torch.__version__, "nccl", e.HAVE_NCCL, "gpus", torch.cuda.device_count())')"
# The same benchmark launched by baguarun and by torchrun (both launchers).
PORT=$(( 20000 + RANDOM % 20000 ))
for cfg in "baguarun" "torchrun"; do
  if [ "$cfg" = baguarun ]; then
    RUN=("$BUILD/tools/baguarun/baguarun" --nproc_per_node 2 --master_port 0 -- "$PY")
  else
    RUN=("$PY" -m torch.distributed.run --nproc_per_node 2 --master_port "$PORT")
  fi
  timeout 35 "${RUN[@]}" "$ROOT/bench/ddp/mlp_step.py" \
    --device cuda --layers 8 --width 4096 --batch 64 --steps 30 --warmup 5 --rounds 3 \
    --json "$OUT/python-ddp-$cfg.json" > "$OUT/python-ddp-$cfg.log" 2>&1
  rc=$?
  grep -E "^(mlp_step|  )" "$OUT/python-ddp-$cfg.log" || { echo "mlp_step ($cfg) rc=$rc"; tail -5 "$OUT/python-ddp-$cfg.log"; }
  cat "$OUT/python-ddp-$cfg.log" >> "$LOG"
done
# The whole pytest suite also runs in run.sh's test phase (meson suite 'python', GPUs visible);
# here, after the benchmarks, the GPU cases (CUDA/NCCL, the Lightning strategy on GPUs) within
# what is left of the step's 3 minutes.
budget=$(( 170 - SECONDS ))
[ "$budget" -lt 30 ] && budget=30
timeout "$budget" "$PY" -m pytest -q -p no:cacheprovider -rs "$ROOT/tests/python/test_gpu.py" \
  "$ROOT/tests/python/test_lightning.py" "$ROOT/tests/python/test_qadam_state.py" \
  > "$OUT/python-pytest.log" 2>&1
echo "pytest (GPU cases) rc=$? : $(tail -1 "$OUT/python-pytest.log")"
grep -E "^(FAILED|ERROR|SKIPPED)" "$OUT/python-pytest.log" | head -8
cat "$OUT/python-pytest.log" >> "$LOG"
