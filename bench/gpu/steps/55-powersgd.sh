#!/usr/bin/env bash
# PowerSGD on CUDA tensors, 2 GPUs (one rank each) over NCCL: the C++ reference tests
# (algorithms_gpu_test, GpuAlgorithms.PowerSgd*: every step against the double-precision
# reference, ranks bitwise equal, the host backend's run, quantised factors within their bound)
# and the Python ones (tests/python/test_powersgd.py with the venv's torch: the CUDA case against
# the test's own reference, plus the CPU cases). Tests, not timings.
# Alone, with a short build: BAGUA_GPU_PHASES=steps BAGUA_GPU_STEPS=55
#   BAGUA_GPU_MESON_ARGS=-Dgpu_arch=90 BAGUA_GPU_TARGETS='^(algorithms_gpu_test|_bagua_ext.*|baguarun)$'
#   bench/gpu/run.sh
# Env from bench/gpu/run.sh: ROOT, BUILD, OUT. Detail in $OUT/55-powersgd.log.
set -uo pipefail
LOG="$OUT/55-powersgd.log"
: > "$LOG"
T="$BUILD/tests/algorithms_gpu_test"
rc=0
if [ -x "$T" ]; then
  timeout 150 "$T" --gtest_filter='GpuAlgorithms.PowerSgd*' >> "$LOG" 2>&1
  crc=$?
  grep -E '^\[ +(OK|FAILED|SKIPPED) +\]|Failure|Expected|Which is|worst' "$LOG" | head -30
  echo "-- algorithms_gpu_test GpuAlgorithms.PowerSgd*: rc=$crc"
  [ "$crc" = 0 ] || rc=1
else
  echo "-- $T was not built"
  rc=1
fi

PY=/opt/torch/.venv/bin/python
[ -x "$PY" ] || PY=python3
ext_ok() { PYTHONPATH="$BUILD/python" "$PY" -c 'import _bagua_ext' >> "$LOG" 2>&1; }
if ! ext_ok; then
  # The build picked another interpreter: build the extension for this one (as step 50 does).
  echo "== building _bagua_ext for $PY" >> "$LOG"
  meson configure "$BUILD" -Dpython="$PY" >> "$LOG" 2>&1
  ninja -C "$BUILD" build.ninja >> "$LOG" 2>&1
  target=$(cd "$BUILD" && ninja -t targets all 2>/dev/null | grep -o '^python/_bagua_ext[^:]*\.so' | head -1)
  [ -n "$target" ] && timeout 120 ninja -C "$BUILD" "$target" >> "$LOG" 2>&1
fi
if ext_ok; then
  echo "== pytest test_powersgd.py" >> "$LOG"
  PYTHONPATH="$ROOT/python:$BUILD/python:$ROOT/tests/python" timeout 240 "$PY" -m pytest -q -s \
    -p no:cacheprovider "$ROOT/tests/python/test_powersgd.py" >> "$LOG" 2>&1
  prc=$?
  grep -E 'passed|failed|skipped|Error|held-out|assert' "$LOG" | grep -v '^== ' | tail -10
  echo "-- test_powersgd.py with $PY: rc=$prc"
  [ "$prc" = 0 ] || rc=1
else
  echo "-- test_powersgd.py not run: _bagua_ext not importable by $PY (see 55-powersgd.log)"
  rc=1
fi
exit "$rc"
