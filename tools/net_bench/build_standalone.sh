#!/usr/bin/env bash
# Builds libnccl-net.so, bagua-net-bench and (when CUDA and NCCL are there) bagua-nccl-bench with
# plain g++, for a machine where the full Meson configure cannot run (a dependency of another
# part missing). Same sources and flags that matter as net_plugin/meson.build; the layout of a
# Meson build dir, so tools/net_bench/device_sweep.sh works on it.
#   tools/net_bench/build_standalone.sh OUT_BUILD_DIR [NCCL_HOME]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
B="$1"; NCCL_HOME_DIR="${2:-}"
mkdir -p "$B/obj" "$B/net_plugin" "$B/tools/net_bench" "$B/tools/nccl_bench"
cat > "$B/bagua_config.h" <<CFG
#pragma once
#define BAGUA_HAVE_CUDA 1
#define BAGUA_HAVE_NCCL 1
#define BAGUA_HAVE_IBVERBS 0
#define BAGUA_HAVE_REDIS 0
#define BAGUA_ENABLE_TRACE 0
#define BAGUA_VERSION "standalone"
CFG
CXX="${CXX:-g++}"
FLAGS=(-std=c++20 -O2 -g -fPIC -pthread -I"$ROOT/base/include" -I"$ROOT/net_plugin/include"
       -I"$ROOT/net_plugin/src" -I"$ROOT/tools/cli_support/include" -I"$B")
objs=()
# The engine: every net_plugin/src/*.cc but the plugin's internals and ABI adapters (the same
# split as net_plugin/meson.build).
engine=()
for f in "$ROOT"/net_plugin/src/*.cc; do
  case "$(basename "$f")" in plugin_api.cc|tuner.cc|abi_*.cc) ;; *) engine+=("$f") ;; esac
done
for f in "$ROOT"/base/src/*.cc "${engine[@]}"; do
  o="$B/obj/$(basename "$(dirname "$(dirname "$f")")")_$(basename "$f" .cc).o"
  "$CXX" "${FLAGS[@]}" -c "$f" -o "$o" &
  objs+=("$o")
done
for f in "$ROOT"/net_plugin/src/{plugin_api,tuner,abi_nccl,abi_tuner}.cc; do
  "$CXX" "${FLAGS[@]}" -fvisibility=hidden -c "$f" -o "$B/obj/plugin_$(basename "$f" .cc).o" &
done
wait
"$CXX" -shared -o "$B/net_plugin/libnccl-net.so" "$B"/obj/plugin_*.o "${objs[@]}" -pthread \
  -Wl,--version-script="$ROOT/net_plugin/src/nccl-net.map" -Wl,-z,defs
ln -sf libnccl-net.so "$B/net_plugin/libnccl-net-bagua.so"
base_objs=("$B"/obj/base_*.o)
engine_objs=("$B"/obj/net_plugin_*.o)
# The tools' command line (CLI11) and JSON (nlohmann): the system's headers (the bagua script's
# APT_PACKAGES), tools/cli_support compiled in.
"$CXX" "${FLAGS[@]}" "$ROOT"/tools/net_bench/{links,main,ring}.cc "$ROOT/tools/cli_support/cli.cc" "${engine_objs[@]}" "${base_objs[@]}" -ldl \
  -o "$B/tools/net_bench/bagua-net-bench"
if [ -n "$NCCL_HOME_DIR" ] && [ -f "$ROOT/tools/nccl_bench/main.cc" ]; then
  CUDA="${CUDA_HOME:-/usr/local/cuda}"
  nccl_lib=$(ls "$NCCL_HOME_DIR"/lib/libnccl.so* | head -1)
  "$CXX" "${FLAGS[@]}" -I"$ROOT/tools/gpu_tool_support/include" -I"$CUDA/include" -isystem "$NCCL_HOME_DIR/include" \
    "$ROOT/tools/nccl_bench/main.cc" "$ROOT/tools/cli_support/cli.cc" "${engine_objs[@]}" "${base_objs[@]}" -L"$CUDA/lib64" -lcudart "$nccl_lib" \
    -Wl,-rpath,"$NCCL_HOME_DIR/lib" -Wl,-rpath,"$CUDA/lib64" -o "$B/tools/nccl_bench/bagua-nccl-bench"
fi
ls -la "$B/net_plugin" "$B/tools/net_bench" "$B/tools/nccl_bench"
