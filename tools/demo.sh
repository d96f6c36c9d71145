#!/usr/bin/env bash
# The main job behind `./bagua demo`. Until the core's training job exists, the demo measures
# the Bagua-Net transport on loopback with bagua-net-bench.
set -euo pipefail
BUILD="$1"; shift
bench="$BUILD/tools/net_bench/bagua-net-bench"
if [ ! -x "$bench" ]; then
  echo "bagua demo: $bench was not built (the net_plugin part is missing from this build)" >&2
  exit 1
fi
exec "$bench" --demo "$@"
