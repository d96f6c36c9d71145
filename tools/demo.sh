#!/usr/bin/env bash
# The main job behind `./bagua demo`:
#   1. a 4-rank data-parallel training run on loopback (CPU, host backend) of a real MLP on
#      generated data, launched with baguarun: progress bar, loss going down, samples/s and the
#      bytes each rank sent (bagua-torch-demo, a libtorch model, when built; else
#      bagua-train-demo, a hand-written MLP);
#   2. the Bagua-Net transport measured on loopback (bagua-net-bench --demo).
# Extra arguments go to the trainer (e.g. --steps 500 --algorithm bytegrad).
set -euo pipefail
BUILD="$1"; shift
launcher="$BUILD/tools/baguarun/baguarun"
trainer="$BUILD/tools/train_demo/bagua-train-demo"
# The libtorch model when libtorch was found at configure time (same options).
if [ -x "$BUILD/tools/torch_demo/bagua-torch-demo" ]; then
  trainer="$BUILD/tools/torch_demo/bagua-torch-demo"
fi
bench="$BUILD/tools/net_bench/bagua-net-bench"
for exe in "$launcher" "$trainer"; do
  if [ ! -x "$exe" ]; then
    echo "bagua demo: $exe was not built" >&2
    exit 1
  fi
done

printf '\n== Part 1: 4-rank data-parallel training (baguarun, host backend, loopback) ==\n'
"$launcher" --nproc_per_node 4 --master_addr 127.0.0.1 --master_port 0 -- "$trainer" "$@"

printf '\n== Part 2: Bagua-Net transport on loopback ==\n'
if [ ! -x "$bench" ]; then
  echo "bagua demo: $bench was not built (the net_plugin part is missing from this build)" >&2
  exit 1
fi
exec "$bench" --demo
