#!/usr/bin/env bash
# baguarun takes Bagua's launcher flags with Bagua's meaning (tools/README.md "Bagua's launcher
# flags"), in both spellings:
#   --enable_bagua_net        every rank gets NCCL_NET_PLUGIN = this build's Bagua-Net plugin
#   --bagua_service_port P    every rank gets BAGUA_SERVICE_PORT=P
#   a PROG.py                 runs as `python3 -u PROG.py` (unbuffered stdout), as Bagua ran it
#   --no_python               PROG.py runs directly (its shebang; buffered stdout)
# usage: baguarun_bagua_flags_test.sh BAGUARUN PLUGIN
set -uo pipefail
baguarun="$1"; plugin="$(readlink -f "$2")"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; sed 's/^/  | /' "$dir/out" "$dir/err" | tail -12; exit 1; }
run() { env -u PYTHONUNBUFFERED timeout 60 "$baguarun" --nproc_per_node 2 --master_port 0 "$@" >"$dir/out" 2>"$dir/err"; }

for spelling in _ -; do
  run "--enable${spelling}bagua${spelling}net" "--bagua${spelling}service${spelling}port" 4321 \
    -- sh -c 'echo "rank=$RANK port=$BAGUA_SERVICE_PORT plugin=$NCCL_NET_PLUGIN"' ||
    fail "--enable${spelling}bagua${spelling}net: exit status $?"
  for rank in 0 1; do
    grep -qx "rank=$rank port=4321 plugin=$plugin" "$dir/out" ||
      fail "rank $rank lacks BAGUA_SERVICE_PORT=4321 or NCCL_NET_PLUGIN=$plugin (spelling '$spelling')"
  done
done
echo "ok: --enable_bagua_net and --bagua_service_port (both spellings) reach every rank"

# Without the flags the ranks get neither variable from baguarun.
env -u NCCL_NET_PLUGIN -u BAGUA_SERVICE_PORT "$baguarun" --nproc_per_node 1 --master_port 0 -- \
  sh -c 'echo "port=${BAGUA_SERVICE_PORT-unset} plugin=${NCCL_NET_PLUGIN-unset}"' \
  >"$dir/out" 2>"$dir/err" || fail "plain run: exit status $?"
grep -qx "port=unset plugin=unset" "$dir/out" || fail "a plain run set BAGUA_SERVICE_PORT or NCCL_NET_PLUGIN"

# A Python program: python3 -u (write_through: unbuffered), or directly with --no_python
# (run() drops PYTHONUNBUFFERED from the environment, which would make both unbuffered).
cat >"$dir/prog.py" <<'PY'
#!/usr/bin/env python3
import os, sys
print("rank", os.environ["RANK"], "unbuffered" if sys.stdout.write_through else "buffered")
PY
chmod +x "$dir/prog.py"
run "$dir/prog.py" || fail "PROG.py: exit status $?"
[ "$(grep -c '^rank [01] unbuffered$' "$dir/out")" = 2 ] || fail "PROG.py did not run as python3 -u"
for flag in --no_python --no-python; do
  run "$flag" "$dir/prog.py" || fail "$flag PROG.py: exit status $?"
  [ "$(grep -c '^rank [01] buffered$' "$dir/out")" = 2 ] || fail "$flag: PROG.py did not run directly"
done
echo "ok: PROG.py runs as python3 -u PROG.py, directly with --no_python"

# A value that is not a port: a usage error naming it.
run --bagua_service_port 99999 -- true; rc=$?
[ "$rc" = 2 ] && grep -q -- "--bagua_service_port must be an integer in \[0, 65535\], got '99999'" \
  "$dir/err" || fail "--bagua_service_port 99999: exit status $rc, want 2 naming the value"
echo "ok: a bad --bagua_service_port exits 2 naming it"
