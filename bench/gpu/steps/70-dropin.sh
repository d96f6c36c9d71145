#!/usr/bin/env bash
# Drop-in Bagua on the GPU machine, with the venv's torch (2.11): Bagua's own test
# suite, its synthetic benchmark and communication-primitives example run unchanged under both
# of our launchers (every algorithm, with and without --fuse-optimizer), and lightning-Bagua's
# strategy tests. Upstream's files are not in the repository: they travel in the ignored folder
# third_party_fetch/dropin (carry it: run's carry ["third_party_fetch/dropin"]; how to make
# it: python/README.md, "Bagua's own tests").
#
# Parts (DROPIN_PARTS, default all; each fits one device call): "upstream" (Bagua's tests/),
# "bench" (synthetic_benchmark.py: 6 algorithms x 2 launchers x fuse on/off), "prims"
# (communication_primitives/main.py under both launchers; its alltoall_v case hard-codes 8
# ranks, so it needs 8 GPUs), "mnist" (examples/mnist/main.py: 6 algorithms x 2 launchers x
# fuse on/off, one epoch on synthetic MNIST files made here: the machine has no network), and
# "lightning" (lightning-Bagua's tests, if Lightning is installed).
# DROPIN_NPROC: ranks per launch (default: min(GPUs, 8); bench uses min(that, DROPIN_BENCH_NPROC=2)).
# DROPIN_LIGHTNING_PATH: a folder put first on the lightning part's PYTHONPATH, holding a Lightning
# older than the machine's (lightning-Bagua needs < 2.1; the GPU machine has 2.6 and installs
# nothing), e.g. Lightning 2.0.9's src/lightning/{pytorch,fabric} from its git tag
# (python/README.md).
# Env from bench/gpu/run.sh: ROOT, BUILD, OUT. Logs under $OUT/dropin/; one line per case here.
set -uo pipefail
ROOT="${ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)}"
BUILD="${BUILD:-$ROOT/build-gpu}"
OUT="${OUT:-$ROOT/gpu-out}"
D="$OUT/dropin"
mkdir -p "$D"
PY="${DROPIN_PYTHON:-/opt/torch/.venv/bin/python}"
[ -x "$PY" ] || PY=python3
UP="$ROOT/third_party_fetch/dropin"
[ -d "$UP/bagua-tests/tests" ] ||
  { echo "dropin: $UP missing (carry third_party_fetch/dropin)"; exit 0; }
if [ "${DROPIN_USE_INSTALLED:-0}" = 1 ]; then
  # The package as a user has it: installed by 85-install (INSTALL_KEEP=1), no source tree on the path.
  unset PYTHONPATH
  (cd "$D" && "$PY" -c 'import bagua, _bagua_ext; print("dropin: installed bagua", bagua.__version__, "at", bagua.__file__)') \
    || { echo "dropin: no installed bagua for $PY (run 85-install with INSTALL_KEEP=1 first)"; exit 1; }
else
  PYTHONPATH="$ROOT/python:$BUILD/python" "$PY" -c 'import _bagua_ext' 2>/dev/null \
    || { echo "dropin: _bagua_ext not importable by $PY (run step 50 first)"; exit 1; }
  export PYTHONPATH="$ROOT/python:$BUILD/python"
fi
# Seconds left before run.sh's limit for this step (BAGUA_STEP_DEADLINE, epoch seconds), less
# DROPIN_RESERVE kept for the parts after "upstream".
time_left() { echo $(( ${BAGUA_STEP_DEADLINE:-$(( $(date +%s) + 100000 ))} - $(date +%s) - ${DROPIN_RESERVE:-0} )); }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
NGPU=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
NPROC="${DROPIN_NPROC:-$(( NGPU < 8 ? NGPU : 8 ))}"
BNPROC="${DROPIN_BENCH_NPROC:-2}"; [ "$BNPROC" -gt "$NPROC" ] && BNPROC="$NPROC"
PARTS=" ${DROPIN_PARTS:-upstream bench prims mnist lightning} "
want() { [[ "$PARTS" == *" $1 "* ]]; }
echo "dropin: $("$PY" -c 'import torch, sys; print("torch", torch.__version__, "python", sys.version.split()[0])') gpus=$NGPU nproc=$NPROC upstream: $(cat "$UP/SOURCES" 2>/dev/null)"
port() { echo $(( 20000 + RANDOM % 20000 )); }

if want upstream; then
  # Bagua's tests/ as they are (each GPU test spawns torch.cuda.device_count() ranks), one pytest
  # per file under its own time limit (a file that hangs costs DROPIN_FILE_TIMEOUT, not the rest),
  # -v so that each case's name and outcome is in the log even when its file is cut off.
  # tests/service is Bagua's HTTP autotune service, not provided (python/README.md).
  : > "$D/upstream.log"
  tp=0; tf=0; ts=0; te=0
  t_start=$SECONDS
  # DROPIN_FILES: an extended regex over the file paths (tests/...) to run only those.
  for f in $(cd "$UP/bagua-tests" && find tests -name 'test_*.py' -not -path 'tests/service/*' | sort \
      | grep -E "${DROPIN_FILES:-.}"); do
    if [ $((SECONDS - t_start)) -ge "${DROPIN_UPSTREAM_TIMEOUT:-520}" ] || [ "$(time_left)" -lt 20 ]; then
      echo "  $f: not run (DROPIN_UPSTREAM_TIMEOUT or the step's limit reached)"; continue
    fi
    t0=$SECONDS
    ft=${DROPIN_FILE_TIMEOUT:-240}; [ "$(time_left)" -lt "$ft" ] && ft=$(time_left)
    (cd "$UP/bagua-tests" && timeout "$ft" "$PY" -m pytest -v \
        -p no:cacheprovider -rfEs "$f" > "$D/upstream-file.log" 2>&1)
    rc=$?
    cat "$D/upstream-file.log" >> "$D/upstream.log"
    p=$(grep -c ' PASSED' "$D/upstream-file.log"); fl=$(grep -c ' FAILED' "$D/upstream-file.log")
    sk=$(grep -c ' SKIPPED' "$D/upstream-file.log"); er=$(grep -c '^ERROR ' "$D/upstream-file.log")
    tp=$((tp + p)); tf=$((tf + fl)); ts=$((ts + sk)); te=$((te + er))
    why=""; [ "$rc" = 124 ] && why=" TIMEOUT"
    [ "$rc" = 2 ] || [ "$rc" = 4 ] && why=" $(grep -m1 -oE '(ModuleNotFoundError|ImportError): .*' "$D/upstream-file.log")"
    echo "  $f: rc=$rc $((SECONDS - t0))s passed=$p failed=$fl skipped=$sk errors=$er$why"
    grep -E ' FAILED| ERROR' "$D/upstream-file.log" | grep '::' | sed 's/^/      /' | head -6
  done
  rm -f "$D/upstream-file.log"
  echo "upstream tests: $tp passed, $tf failed, $ts skipped, $te errors ($((SECONDS - t_start)) s)"
fi

# With one GPU, a 2-rank launch is 2 "nodes" of one rank each on cuda:0 (each its own
# NCCL_HOSTID under MPS, over NCCL's network path): the scripts stay unchanged (LOCAL_RANK is 0
# on both, so their torch.cuda.set_device(bagua.get_local_rank()) picks cuda:0).
source "$ROOT/bench/gpu/mps.sh"
SHARE=0
if [ "$NGPU" = 1 ] && [ "${DROPIN_SHARE_GPU:-1}" = 1 ]; then
  SHARE=1; NPROC=2; BNPROC=2
  start_mps /dev/null || true
  echo "one GPU: 2-rank launches run as 2 nodes x 1 rank on cuda:0 (MPS, NCCL_HOSTID per node, network path)"
fi

launch_one() {  # launcher nnodes node_rank nproc master_port script args...
  local launcher="$1" nn="$2" nr="$3" n="$4" mp="$5"; shift 5
  if [ "$launcher" = launch ]; then
    "$PY" -m bagua.distributed.launch --nnodes "$nn" --node_rank "$nr" --nproc_per_node "$n" \
      --master_addr 127.0.0.1 --master_port "$mp" "$@"
  elif [ "$nn" = 1 ]; then
    "$PY" -m bagua.distributed.run --standalone --nproc_per_node "$n" "$@"
  else
    "$PY" -m bagua.distributed.run --nnodes "$nn" --node_rank "$nr" --nproc_per_node "$n" \
      --master_addr 127.0.0.1 --master_port "$mp" "$@"
  fi
}

run_nodes() {  # log launcher nodes master_port script args...: one rank per node, all on cuda:0
  local log="$1" launcher="$2" nn="$3" mp="$4"; shift 4
  local pids=() i rc=0 r
  for ((i = nn - 1; i >= 0; i--)); do
    NCCL_HOSTID=dropin-node$i NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo \
      timeout "${DROPIN_CASE_TIMEOUT:-150}" bash -c "$(declare -f launch_one); PY='$PY' launch_one \"\$@\"" \
      _ "$launcher" "$nn" "$i" 1 "$mp" "$@" > "$log.node$i" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; r=$?; [ "$rc" = 0 ] && rc=$r; done
  for ((i = 0; i < nn; i++)); do cat "$log.node$i" >> "$log"; rm -f "$log.node$i"; done
  return "$rc"
}

run_launch() {  # label launcher nproc script args...
  local label="$1" launcher="$2" n="$3"; shift 3
  local log="$D/$label.log" t0=$SECONDS rc mp
  mp=$(port)
  : > "$log"
  if [ "$n" -gt "$NGPU" ]; then
    # More ranks than GPUs (also the one-GPU share mode): n "nodes" of one rank each on cuda:0
    # (MPS, NCCL_HOSTID per node).
    run_nodes "$log" "$launcher" "$n" "$mp" "$@"
    rc=$?
  else
    timeout "${DROPIN_CASE_TIMEOUT:-150}" bash -c "$(declare -f launch_one); PY='$PY' launch_one \"\$@\"" \
      _ "$launcher" 1 0 "$n" "$mp" "$@" > "$log" 2>&1
    rc=$?
  fi
  echo "$label rc=$rc $((SECONDS - t0))s $(grep -E 'Total img/sec|Img/sec per' "$log" | tail -1)"
  [ "$rc" = 0 ] || grep -E "Error|error|FAILED" "$log" | tail -3
}

if want bench; then
  "$PY" -c 'import torchvision' 2>/dev/null \
    || echo "bench: torchvision not importable by $PY (synthetic_benchmark.py needs it)"
  for algo in gradient_allreduce bytegrad decentralized low_precision_decentralized qadam async; do
    for launcher in launch run; do
      for fuse in "" "--fuse-optimizer"; do
        # DROPIN_PARALLEL launches at a time (default 4; the cases are small: resnet18, batch 32):
        # the 24 cases are correctness runs, their img/sec not comparable with each other.
        while [ "$(jobs -rp | wc -l)" -ge "${DROPIN_PARALLEL:-4}" ]; do wait -n; done
        run_launch "bench-$algo-$launcher${fuse:+-fuse}" "$launcher" "$BNPROC" \
          "$UP/examples/benchmark/synthetic_benchmark.py" --algorithm "$algo" --model resnet18 \
          --batch-size 32 --num-warmup-batches 2 --num-batches-per-iter 5 --num-iters 3 \
          --async-warmup-steps 2 --async-sync-interval 50 $fuse &
      done
    done
  done
  wait
  echo "bench: $(grep -l . "$D"/bench-*.log | wc -l) cases run, failed: $(grep -L 'Total img/sec' "$D"/bench-*.log | xargs -r -n1 basename | tr '\n' ' ')"
fi

if want prims; then
  # main.py's alltoall_v case hard-codes 8 ranks (torch's all_to_all_single with 8 splits), so it
  # runs with 8 ranks whatever the GPU count: with fewer GPUs, 8 nodes of one rank on cuda:0.
  PNPROC=${DROPIN_PRIMS_NPROC:-8}
  if [ "$PNPROC" -gt "$NGPU" ] && [ "$SHARE" = 0 ]; then
    start_mps /dev/null || true
    echo "prims: $PNPROC ranks on $NGPU GPU(s): $PNPROC nodes x 1 rank on cuda:0 (MPS, NCCL_HOSTID per node, network path)"
  fi
  for launcher in launch run; do
    run_launch "prims-$launcher" "$launcher" "$PNPROC" "$UP/examples/communication_primitives/main.py"
    grep -E "Traceback|Error" "$D/prims-$launcher.log" | sort | uniq -c | head -4
  done
fi

if want mnist && [ -f "$UP/examples/mnist/main.py" ]; then
  # Bagua's MNIST example as a user runs it (a torch LR scheduler made after with_bagua, the
  # fused optimizer's fuse_step, async's resume/abort per epoch), on MNIST-format files made
  # here: 2048 training and 512 test images whose label is the row of a bright bar (learnable
  # in one epoch). qadam gets --lr 0.001: the example's default lr (1.0, for Adadelta) makes
  # Adam diverge, in Bagua as here.
  M="$D/mnist"
  mkdir -p "$M/work" "$M/data/MNIST/raw"
  "$PY" - "$M/data/MNIST/raw" <<'PYGEN'
import os, struct, sys
import numpy as np
rng = np.random.default_rng(0)
for n, img, lab in ((2048, "train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
                    (512, "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")):
    labels = rng.integers(0, 10, n).astype(np.uint8)
    x = rng.integers(0, 60, (n, 28, 28)).astype(np.uint8)
    for i, l in enumerate(labels):
        x[i, 2 + 2 * l:4 + 2 * l, 4:24] = 255
    with open(os.path.join(sys.argv[1], img), "wb") as f:
        f.write(struct.pack(">IIII", 2051, n, 28, 28) + x.tobytes())
    with open(os.path.join(sys.argv[1], lab), "wb") as f:
        f.write(struct.pack(">II", 2049, n) + labels.tobytes())
PYGEN
  for algo in gradient_allreduce bytegrad decentralized low_precision_decentralized qadam async; do
    for launcher in launch run; do
      for fuse in "" "--fuse-optimizer"; do
        while [ "$(jobs -rp | wc -l)" -ge "${DROPIN_PARALLEL:-4}" ]; do wait -n; done
        (cd "$M/work" && run_launch "mnist-$algo-$launcher${fuse:+-fuse}" "$launcher" "$BNPROC" \
          "$UP/examples/mnist/main.py" --algorithm "$algo" --epochs 1 --batch-size 128 \
          --test-batch-size 256 $([ "$algo" = qadam ] && echo --lr 0.001) $fuse > /dev/null) &
      done
    done
  done
  wait
  ok=0; bad=""
  for log in "$D"/mnist-*.log; do
    acc=$(grep -oE 'Accuracy: [0-9]+/512' "$log" | tail -1 | grep -oE '[0-9]+/' | tr -d /)
    if [ -n "$acc" ] && [ "$acc" -ge 460 ]; then
      ok=$((ok + 1))
    else
      bad+="$(basename "$log" .log)(${acc:-no result}) "
    fi
  done
  echo "mnist: $ok of $(ls "$D"/mnist-*.log | wc -l) cases reached >= 90% test accuracy;" \
    "failed: ${bad:-none}"
fi

if want lightning; then
  if [ -n "${DROPIN_LIGHTNING_PATH:-}" ]; then
    export PYTHONPATH="$DROPIN_LIGHTNING_PATH${PYTHONPATH:+:$PYTHONPATH}"
    "$PY" -c 'import lightning as L; print("lightning:", L.__version__, "from", L.__file__)' \
      2>&1 | tail -3
  fi
  if "$PY" -c 'import lightning_utilities; import lightning' 2>/dev/null \
      || "$PY" -c 'import lightning_utilities; import pytorch_lightning' 2>/dev/null; then
    # lightning-Bagua's tests, the standalone (multi-GPU) ones one process tree each, as its
    # run_standalone_tests.sh does. --rootdir=.: pytest >= 8.1 takes a pyproject.toml above (ours)
    # as the root, and the ids it collects would not resolve from here.
    (cd "$UP/lightning-Bagua" && export PYTHONPATH="$UP/lightning-Bagua/src${PYTHONPATH:+:$PYTHONPATH}" \
      PL_RUN_STANDALONE_TESTS=1 && \
      "$PY" -m pytest -q --collect-only -p no:cacheprovider --rootdir=. tests \
        > "$D/lightning-collect.log" 2>&1; \
      ids=$(grep '::' "$D/lightning-collect.log"); \
      [ -n "$ids" ] || { echo "lightning: no test collected:"; grep -E "Error|error" "$D/lightning-collect.log" | head -5; \
        "$PY" -c 'import sys, lightning as L; sys.exit(tuple(map(int, L.__version__.split(".")[:2])) >= (2, 1))' \
          2>/dev/null || echo "lightning: lightning_bagua needs Lightning < 2.1 (its strategy.py imports" \
          "lightning.pytorch.overrides.base and PrecisionPlugin, both removed in 2.1)"; }; \
      pass=0; fail=0; for id in $ids; do
        if timeout 120 "$PY" -m pytest -q -p no:cacheprovider --rootdir=. "$id" \
            > "$D/lightning-one.log" 2>&1; then
          pass=$((pass + 1))
          # what pytest's summary line says it was: passed, skipped (with its reason), xpassed
          echo "lightning $(grep -oE '[0-9]+ (passed|skipped|xpassed|xfailed)' \
            "$D/lightning-one.log" | tr '\n' ' ')$id"
        else
          fail=$((fail + 1)); echo "lightning FAILED $id"; fi
        cat "$D/lightning-one.log" >> "$D/lightning.log"
      done; rm -f "$D/lightning-one.log"
      echo "lightning-Bagua tests: $pass without failure (passed, skipped or xpassed), $fail failed")
  else
    echo "lightning: neither lightning nor pytorch_lightning importable by $PY"
  fi
fi
