#!/usr/bin/env bash
# Installable bagua on the GPU machine: the wheel built with CUDA + NCCL for the venv's
# Python and torch (2.11), installed into that venv, then a plain torch DDP job (no bagua API)
# that loads the plugin through NCCL_NET_PLUGIN=$(python -c 'import bagua;
# print(bagua.net_plugin_path())'): its NCCL_DEBUG=INFO log must show "NET/Plugin: Loaded net
# plugin Bagua" and our init line "Bagua-Net <version>", and the ranks must agree; then the same
# job with NCCL_NET_PLUGIN=bagua and the package folder on LD_LIBRARY_PATH (libnccl-net-bagua.so).
#
# The wheel: pip wheel through meson-python when the venv's Python imports mesonpy; otherwise
# python/build_wheel.py, which does meson-python's job with Meson alone (same setup arguments,
# from pyproject.toml). NCCL: the one torch ships (-Dnccl_home), CUDA kernels for every
# architecture (the default), as a user's `pip install .` builds them.
# The DDP job: 2 ranks on cuda:0 with distinct NCCL_HOSTID (so NCCL takes them for two hosts and
# goes through the network plugin), P2P and SHM off, loopback. It runs from a folder outside the
# tree; the venv is left as found (bagua uninstalled at the end).
#
# Alone (needs no build-gpu): OUT=/some/dir bash bench/gpu/steps/85-install.sh
# Through run.sh: BAGUA_GPU_PHASES=steps BAGUA_GPU_STEPS=85 bench/gpu/run.sh (builds build-gpu
# first). Last line: 'install: PASS|FAIL (why)'. Detail: $OUT/install/.
# Environment: INSTALL_PYTHON (default /opt/torch/.venv/bin/python), INSTALL_MESON_ARGS (extra
# -Dname=value for the wheel's build, e.g. -Dgpu_arch=90 for a quicker one), INSTALL_BUILD_DIR
# (a build folder build_wheel.py keeps and reuses; default a fresh one), INSTALL_WHEEL (a wheel
# built earlier, e.g. carried from a former call: installed instead of building one),
# INSTALL_KEEP=1 (leave bagua installed for the steps after this one, and copy the wheel to the
# top of $OUT, where run.sh leaves it out of the log archive so that it comes back).
# step-timeout: 560
set -uo pipefail
ROOT="${ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)}"
OUT="${OUT:-$ROOT/gpu-out}"
D="$OUT/install"
mkdir -p "$D"
cd "$D"  # never the source tree: its torch/ folder would pass for the torch package
PY="${INSTALL_PYTHON:-/opt/torch/.venv/bin/python}"
[ -x "$PY" ] || PY=python3
verdict() { echo "install: $*"; [[ "$*" == PASS* ]]; exit $?; }
t0=$SECONDS

NCCL_HOME_DIR="${NCCL_HOME_DIR:-$("$PY" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)}"
echo "install: $("$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "nccl", ".".join(map(str, torch.cuda.nccl.version())))' 2>&1 | tail -1), NCCL home ${NCCL_HOME_DIR:-<cuda>}"
# One Meson option at most: pip before 23.1 keeps only the last of repeated --config-settings.
args=()
[ -n "$NCCL_HOME_DIR" ] && args+=("-Dnccl_home=$NCCL_HOME_DIR")
read -r -a extra_args <<< "${INSTALL_MESON_ARGS:-}"
args+=("${extra_args[@]}")

rm -rf "$D/dist"
if [ -n "${INSTALL_WHEEL:-}" ]; then
  how="given wheel"
  mkdir -p "$D/dist" && cp "$INSTALL_WHEEL" "$D/dist/"
  : > "$D/wheel.log"
elif "$PY" -c 'import mesonpy' 2>/dev/null; then
  how="meson-python $("$PY" -c 'import mesonpy; print(getattr(mesonpy, "__version__", "?"))')"
  cs=(--config-settings=compile-args=-j"$(nproc)")
  for a in "${args[@]}"; do cs+=("--config-settings=setup-args=$a"); done
  (cd "$ROOT" && "$PY" -m pip wheel --no-build-isolation --no-index --no-deps -w "$D/dist" \
     "${cs[@]}" . > "$D/wheel.log" 2>&1)
else
  how="python/build_wheel.py (no meson-python for $PY)"
  "$PY" "$ROOT/python/build_wheel.py" -o "$D/dist" --log "$D/wheel.log" \
    ${INSTALL_BUILD_DIR:+--builddir "$INSTALL_BUILD_DIR"} "${args[@]}" > /dev/null
fi
rc=$?
WHEEL=$(ls "$D"/dist/bagua-*.whl 2>/dev/null | head -1)
echo "wheel: $how, rc=$rc, $((SECONDS - t0))s: $(basename "${WHEEL:-none}")"
[ "$rc" = 0 ] && [ -n "$WHEEL" ] || { grep -E 'ERROR|error|FAILED' "$D/wheel.log" | tail -15; verdict "FAIL (the wheel did not build: $D/wheel.log)"; }
grep -E '^ *(cuda|cuda kernels|nccl|python front end) *:' "$D/wheel.log" | head -4

if "$PY" -m pip --version > /dev/null 2>&1; then
  "$PY" -m pip install --no-build-isolation --no-index --force-reinstall --no-deps "$WHEEL" \
    > "$D/pip-install.log" 2>&1 || { tail -15 "$D/pip-install.log"; verdict "FAIL (pip install)"; }
  cleanup() { "$PY" -m pip uninstall -y bagua > /dev/null 2>&1; }
else
  # A venv made by uv has no pip: unpack the wheel as pip would (the package and the extension
  # into platlib, <name>.data/scripts into the venv's bin), remembering each file for the cleanup.
  echo "install: no pip for $PY: unpacking the wheel by hand"
  "$PY" - "$WHEEL" "$D/installed-files.txt" > "$D/pip-install.log" 2>&1 <<'PYEOF' \
    || { tail -15 "$D/pip-install.log"; verdict "FAIL (unpacking the wheel without pip)"; }
import os, sys, sysconfig, zipfile
wheel, record = sys.argv[1], sys.argv[2]
paths = sysconfig.get_paths()
written = []
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        name = info.filename
        if name.endswith("/"):
            continue
        top, _, rest = name.partition("/")
        if top.endswith(".data"):
            kind, _, rest = rest.partition("/")
            if kind != "scripts":
                sys.exit("{}: {} has no place outside pip".format(wheel, name))
            dest = os.path.join(paths["scripts"], rest)
        else:
            dest = os.path.join(paths["platlib"], name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with open(dest, "wb") as f:
            f.write(z.read(name))
        mode = (info.external_attr >> 16) & 0o777
        if mode:
            os.chmod(dest, mode)
        written.append(dest)
with open(record, "w") as f:
    f.write("\n".join(written) + "\n")
print("unpacked {} files into {} and {}".format(len(written), paths["platlib"], paths["scripts"]))
PYEOF
  # The files it wrote, then the package folders whole (imports leave __pycache__ in them).
  cleanup() {
    xargs -d '\n' rm -f < "$D/installed-files.txt"
    rm -rf "$PLATLIB/bagua" "$PLATLIB"/bagua-*.dist-info
  }
  PLATLIB=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
fi
if [ "${INSTALL_KEEP:-0}" = 1 ]; then
  [ -n "${INSTALL_WHEEL:-}" ] || cp "$WHEEL" "$OUT/"
else
  trap cleanup EXIT
fi

mkdir -p "$D/outside" && cd "$D/outside"
unset PYTHONPATH
PLUGIN=$("$PY" -c 'import bagua; print(bagua.net_plugin_path())') || verdict "FAIL (bagua.net_plugin_path())"
VERSION=$("$PY" -c 'import bagua; print(bagua.__version__)')
echo "installed: bagua $VERSION, plugin $PLUGIN, HAVE_NCCL=$("$PY" -c 'import torch, _bagua_ext; print(_bagua_ext.HAVE_NCCL)' 2>&1 | tail -1)"
"$PY" -m bagua.net --check | tail -1

cat > ddp.py <<'EOF'
# Plain torch DDP, 2 ranks on one GPU, NCCL through whatever NCCL_NET_PLUGIN names.
import os, sys, torch, torch.distributed as dist
rank = int(os.environ["RANK"])
os.environ["NCCL_HOSTID"] = "bagua-install-host-{}".format(rank)  # two "hosts": the net path
torch.cuda.set_device(0)
dist.init_process_group("nccl")
torch.manual_seed(rank)  # different weights: DDP broadcasts rank 0's
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)).cuda()
ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
g = torch.Generator(device="cuda").manual_seed(100 + rank)
for _ in range(30):
    x = torch.randn(128, 64, device="cuda", generator=g)
    loss = ddp(x).square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
hi, lo = flat.clone(), flat.clone()
dist.all_reduce(hi, op=dist.ReduceOp.MAX); dist.all_reduce(lo, op=dist.ReduceOp.MIN)
differ = int((hi != lo).sum())
print("ddp rank {}: loss {:.5f}, {} of {} weights differ between ranks".format(rank, loss.item(), differ, flat.numel()), flush=True)
dist.destroy_process_group()
sys.exit(1 if differ else 0)
EOF
# The job twice: NCCL_NET_PLUGIN naming the plugin's path, then NCCL_NET_PLUGIN=bagua with the
# package's folder on LD_LIBRARY_PATH (NCCL then opens libnccl-net-bagua.so by name).
run_ddp() {  # LABEL VAR=VALUE...: one DDP job, its checks; exits with the verdict on a failure
  local label=$1 log="$D/ddp-$1.log" rc
  shift
  env "$@" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV NCCL_P2P_DISABLE=1 \
    NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 NCCL_NVLS_ENABLE=0 \
    timeout 240 "$PY" -m torch.distributed.run --standalone --nproc_per_node 2 ddp.py \
    > "$log" 2>&1
  rc=$?
  echo "ddp ($label: $*):"
  grep -E '^ddp rank' "$log"
  grep -E 'NET/Plugin|Bagua-Net [0-9]|Using network' "$log" | sed -E 's/.*NCCL INFO //' | sort | uniq -c | head -8
  [ "$rc" = 0 ] || { grep -vE 'NCCL INFO' "$log" | tail -15; verdict "FAIL ($label: the DDP job exited with $rc)"; }
  grep -q 'NET/Plugin: Loaded net plugin Bagua' "$log" || verdict "FAIL ($label: no 'NET/Plugin: Loaded net plugin Bagua' in $log)"
  grep -q "Bagua-Net $VERSION" "$log" || verdict "FAIL ($label: no 'Bagua-Net $VERSION' init line)"
  grep -q 'Using network Bagua' "$log" || verdict "FAIL ($label: NCCL loaded the plugin but did not use it)"
  [ "$(grep -c '^ddp rank [01]: .* 0 of [0-9]* weights differ' "$log")" = 2 ] || verdict "FAIL ($label: ranks disagree)"
}
run_ddp path NCCL_NET_PLUGIN="$PLUGIN"
run_ddp name NCCL_NET_PLUGIN=bagua LD_LIBRARY_PATH="$(dirname "$PLUGIN")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
verdict "PASS (bagua $VERSION wheel via $how in $((SECONDS - t0))s; torch DDP loaded $PLUGIN by its path and as NCCL_NET_PLUGIN=bagua)"
