#!/usr/bin/env bash
# Google's nccl-fastsocket, the strongest TCP peer plugin, for side-by-side measurement only
# (GPU step 17, bagua-net-bench --ring ... fastsocket@PATH). Its sources are never committed: they
# go to third_party_fetch/ (ignored by git) and are built where they are measured.
#
#   tools/net_bench/fastsocket.sh stage NCCL_GIT FASTSOCKET_GIT [SRC]
#       (a machine with git mirrors of NVIDIA/nccl and google/nccl-fastsocket) copies
#       fastsocket's sources and the NCCL 2.13.4 plugin header they were written against into SRC
#       (default third_party_fetch/fastsocket/src): what a GPU call carries.
#   tools/net_bench/fastsocket.sh build [SRC] [OUT_DIR]
#       (any machine with g++ and CUDA's headers: nccl.h includes cuda_runtime.h) builds SRC into
#       OUT_DIR/libnccl-net-fastsocket.so (default third_party_fetch/fastsocket). It exports
#       ncclNetPlugin_v2..v6; NCCL 2.19+ loads its v6 table and logs "Loaded net plugin
#       FastSocket (v6)".
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cmd="${1:-}"
case "$cmd" in
  stage)
    nccl="${2:?NVIDIA/nccl git dir}"; fs="${3:?google/nccl-fastsocket git dir}"
    src="${4:-$ROOT/third_party_fetch/fastsocket/src}"
    mkdir -p "$src"
    git -C "$nccl" show v2.13.4-1:src/include/nccl_net.h > "$src/nccl_net.h"
    git -C "$nccl" show v2.13.4-1:src/nccl.h.in | sed -e 's/${nccl:Major}/2/g' \
      -e 's/${nccl:Minor}/13/g' -e 's/${nccl:Patch}/4/g' -e 's/${nccl:Suffix}//g' \
      -e 's/${nccl:Version}/21304/g' > "$src/nccl.h"
    for f in net_fastsocket.cc utilities.cc utilities.h compat.h; do
      git -C "$fs" show "HEAD:$f" > "$src/$f"
    done
    echo "staged fastsocket $(git -C "$fs" rev-parse --short HEAD) in $src"
    ;;
  build)
    src="${2:-$ROOT/third_party_fetch/fastsocket/src}"
    out="${3:-$ROOT/third_party_fetch/fastsocket}"
    [ -f "$src/net_fastsocket.cc" ] || { echo "fastsocket.sh: no sources in $src (stage them first)" >&2; exit 1; }
    mkdir -p "$out"
    "${CXX:-g++}" -O2 -std=c++17 -fPIC -shared -w -I"$src" -I"${CUDA_HOME:-/usr/local/cuda}/include" \
      "$src/net_fastsocket.cc" "$src/utilities.cc" -o "$out/libnccl-net-fastsocket.so" -lpthread
    echo "built $out/libnccl-net-fastsocket.so"
    ;;
  *)
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
