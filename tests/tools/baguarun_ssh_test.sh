#!/usr/bin/env bash
# baguarun's SSH start for real: Debian's sshd in two network namespaces (two "hosts" on one
# bridge, 198.19.<pid % 250>.2 and .3, port 2222), baguarun in a third (the "laptop", .1), host
# and client keys made here, the hosts' keys checked against a known_hosts file made here.
# usage: baguarun_ssh_test.sh BAGUARUN TRAINER
#   usage    a bad host list or a clashing flag exits 2 naming it, before any ssh
#   train    2 hosts x 2 ranks of bagua-cpp-trainer succeed (hosts given as HOST:PORT; --ssh_opts
#            beats BAGUA_SSH_OPTS): every rank first prints RANK, LOCAL_RANK, WORLD_SIZE,
#            LOCAL_WORLD_SIZE, NODE_RANK, NNODES, MASTER_ADDR (the first host), MASTER_PORT, an
#            -x variable with a space and a quote, and its job key (64 hex digits, the same on
#            every rank); all four summaries arrive; every line is prefixed with its host and rank
#   sigint   with the user's BAGUA_JOB_KEY, which no process's command line shows: SIGINT to
#            baguarun mid-run (2 trainers running on each host): exit 130, and no trainer or
#            baguarun is left on a host
#   kill9    SIGKILL to baguarun mid-run: the hosts' ranks still end (their stdin, the lifeline
#            through ssh, ends)
#   refused  a host whose port refuses the connection: a non-zero exit naming that host as not
#            reachable, and the other host's ranks stopped
#   hostdies every process of the second host killed mid-run (sshd, baguarun, ranks: a power
#            cut): a non-zero exit within the bound naming that host as lost, and no trainer or
#            baguarun left on any host
# Skips (exit 77, with the reason) when sshd is not installed or network namespaces are refused.
# Everything made here (namespaces, bridge, sshd processes, keys) is removed on exit, on failure
# too; /run/sshd, sshd's privilege separation directory (the package's service makes it at boot),
# is made when missing and left, as another sshd may be using it.
set -uo pipefail
baguarun="$(realpath "$1")"; trainer="$(realpath "$2")"
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "not root: network namespaces need CAP_NET_ADMIN"
sshd=/usr/sbin/sshd
[ -x "$sshd" ] || skip "sshd is not installed (apt-get install openssh-server)"
for tool in ssh ssh-keygen ip; do
  command -v "$tool" >/dev/null || skip "$tool is not installed"
done

# ---- usage: bad host lists and clashing flags (no network needed) ------------------------------
usage_case() {  # WANT_IN_STDERR ARGS...
  local want="$1" rc
  shift
  timeout 20 "$baguarun" "$@" -- true >/dev/null 2>"$tmp_usage"; rc=$?
  [ "$rc" = 2 ] || { echo "FAIL: usage: baguarun $* exited with $rc, want 2"; exit 1; }
  grep -qF -- "$want" "$tmp_usage" ||
    { echo "FAIL: usage: baguarun $*: stderr lacks '$want':"; cat "$tmp_usage"; exit 1; }
}
tmp_usage="$(mktemp)"
usage_case "empty host name in ''" --host_list "h0,,h1"
usage_case "bad port '99999' in 'h1:99999'" --host_list "h0,h1:99999"
usage_case "bad port 'x' in 'h1:x'" --host_list "h0,h1:x"
usage_case "--ssh_port must be an integer in [1, 65535]" --host_list h0 --ssh_port 0
usage_case "drop --nnodes/--node_rank" --host_list h0,h1 --node_rank 1
usage_case "--master_port 0 (pick a free port) works on one node only" --host_list h0 \
  --master_port 0
usage_case "an elastic one (--nnodes MIN:MAX, --rdzv_*) is started on each node by hand" \
  --host_list h0,h1 --nnodes 1:2
usage_case "-x 1BAD: '1BAD' is not a variable name" --host_list h0 -x 1BAD
BAGUA_SSH_PORT=abc usage_case "BAGUA_SSH_PORT" --host_list h0
rm -f "$tmp_usage"
echo "ok: usage: bad host lists, ports and clashing flags exit 2 naming them"

t0=$SECONDS
tag=$$; sub=$(( $$ % 250 ))
net="198.19.$sub"
client="bs${tag}c"; hosts=("bs${tag}n0" "bs${tag}n1"); addrs=("$net.2" "$net.3")
bridge="bs${tag}br"
tmp="$(mktemp -d)"
made_ns=()

cleanup() {
  for ns in "${made_ns[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
  done
  sleep 0.2
  for ns in "${made_ns[@]}"; do ip netns del "$ns" 2>/dev/null; done
  ip link del "$bridge" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
# Every wait below is bounded, all together well under meson's timeout (a SIGKILL would skip the
# clean-up).

fail() {
  echo "FAIL: $*"
  for f in "$tmp"/out "$tmp"/err "$tmp"/sshd*.log; do
    [ -s "$f" ] && { echo "--- $(basename "$f")"; tail -25 "$f"; }
  done
  exit 1
}

# ---- Hosts: namespaces on a bridge, sshd in each ------------------------------------------------
ip link add "$bridge" type bridge 2>/dev/null || skip "cannot make a bridge (ip link add type bridge)"
ip link set "$bridge" up
i=0
for ns in "$client" "${hosts[@]}"; do
  err="$(ip netns add "$ns" 2>&1)" || skip "ip netns add refused: $err"
  made_ns+=("$ns")
  ip link add "bs${tag}h$i" type veth peer name "bs${tag}v$i" &&
    ip link set "bs${tag}v$i" netns "$ns" &&
    ip link set "bs${tag}h$i" master "$bridge" up &&
    ip -n "$ns" link set lo up &&
    ip -n "$ns" addr add "$net.$((i + 1))/24" dev "bs${tag}v$i" &&
    ip -n "$ns" link set "bs${tag}v$i" up || fail "cannot wire $ns"
  i=$((i + 1))
done
mkdir -p /run/sshd
ssh-keygen -q -t ed25519 -N '' -C client -f "$tmp/client_key" || fail "ssh-keygen (client)"
cp "$tmp/client_key.pub" "$tmp/authorized_keys"
: >"$tmp/known_hosts"
for i in 0 1; do
  ssh-keygen -q -t ed25519 -N '' -C "host$i" -f "$tmp/host$i" || fail "ssh-keygen (host $i)"
  echo "[${addrs[$i]}]:2222 $(cut -d' ' -f1,2 "$tmp/host$i.pub")" >>"$tmp/known_hosts"
  cat >"$tmp/sshd$i.conf" <<EOF
Port 2222
ListenAddress ${addrs[$i]}
HostKey $tmp/host$i
PidFile $tmp/sshd_${hosts[$i]}.pid
AuthorizedKeysFile $tmp/authorized_keys
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
LogLevel ERROR
EOF
  ip netns exec "${hosts[$i]}" "$sshd" -D -e -f "$tmp/sshd$i.conf" 2>>"$tmp/sshd$i.log" &
  disown  # killed at the end; no job notice
done
sshopts="-F /dev/null -l root -i $tmp/client_key -o IdentitiesOnly=yes -o StrictHostKeyChecking=yes"
sshopts+=" -o UserKnownHostsFile=$tmp/known_hosts -o GlobalKnownHostsFile=/dev/null"
export BAGUA_SSH_OPTS="$sshopts"
until=$((SECONDS + 20))
for i in 0 1; do
  until ip netns exec "$client" bash -c "exec 3<>/dev/tcp/${addrs[$i]}/2222" 2>/dev/null; do
    [ "$SECONDS" -lt "$until" ] || fail "sshd on ${hosts[$i]} does not listen on ${addrs[$i]}:2222"
    sleep 0.1
  done
done
echo "ok: sshd up on ${addrs[*]} port 2222 ($((SECONDS - t0)) s)"; t0=$SECONDS

# ---- Helpers ------------------------------------------------------------------------------------
# Processes in namespace $1 running the executable $2: one pgrep in the namespace of its sshd
# while that runs (ip netns pids reads every process's namespace: slow to poll on two busy
# cores), else every process ip netns pids lists.
count_procs() {
  local n=0 pid anchor=""
  [ -s "$tmp/sshd_$1.pid" ] && anchor="$(cat "$tmp/sshd_$1.pid")"
  if [ -n "$anchor" ] && kill -0 "$anchor" 2>/dev/null; then
    pgrep -c --nslist net --ns "$anchor" -f "^${2//./\\.}( |\$)"
    return
  fi
  for pid in $(ip netns pids "$1" 2>/dev/null); do
    [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$2" ] && n=$((n + 1))
  done
  echo "$n"
}
# Waits (up to $1 s) until both hosts' baguarun said it started its 2 ranks (one grep a poll:
# four busy ranks on two cores leave a script that forks more little time).
wait_started() {
  local until=$((SECONDS + $1))
  while [ "$SECONDS" -lt "$until" ]; do
    [ "$(grep -c '\] baguarun: started 2 worker(s)' "$tmp/err")" = 2 ] && return 0
    sleep 0.1
  done
  return 1
}
# Waits (up to $1 s) until no host runs a trainer or a baguarun; fails naming what is left.
expect_no_orphans() {
  local ns exe left until=$((SECONDS + $1))
  while :; do
    left=""
    for ns in "${hosts[@]}"; do
      for exe in "$trainer" "$baguarun"; do
        [ "$(count_procs "$ns" "$exe")" = 0 ] || left+=" $ns:$(basename "$exe")"
      done
    done
    [ -z "$left" ] && return 0
    [ "$SECONDS" -lt "$until" ] || break
    sleep 0.1
  done
  fail "$2: left running after baguarun ended:$left"
}
# Starts a long training run in the background; sets $pid (baguarun's: ip netns exec execs it).
start_long_run() {
  ip netns exec "$client" "$baguarun" --host_list "${addrs[0]},${addrs[1]}" --ssh_port 2222 \
    --nproc_per_node 2 --master_port 29531 --grace_s 2 -- "$trainer" --steps 1000000 \
    >"$tmp/out" 2>"$tmp/err" &
  pid=$!
  wait_started 20 || fail "$1: the ranks did not start on both hosts"
  # baguarun says so once it forked them; each is the trainer once its exec is done (on two busy
  # cores that can take seconds).
  local n0 n1 until=$((SECONDS + 20))
  while :; do
    n0="$(count_procs "${hosts[0]}" "$trainer")"; n1="$(count_procs "${hosts[1]}" "$trainer")"
    [ "$n0$n1" = 22 ] && break
    [ "$SECONDS" -lt "$until" ] || fail "$1: want 2 trainers on each host, found $n0 and $n1"
    sleep 0.2
  done
  sleep 0.5  # into the training loop
}
# Waits (up to $1 s) for baguarun ($pid) to end; sets $rc.
wait_baguarun() {
  local state until=$((SECONDS + $1))
  while [ "$SECONDS" -lt "$until" ]; do
    state="$(cut -d' ' -f3 "/proc/$pid/stat" 2>/dev/null)"
    if [ -z "$state" ] || [ "$state" = Z ]; then  # ended (a zombie until waited for)
      wait "$pid"; rc=$?
      return 0
    fi
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null
  fail "$2: baguarun still running after $1 s"
}

# ---- train: 2 hosts x 2 ranks, and what every rank gets -----------------------------------------
# Each rank prints its variables, then becomes the trainer. --ssh_opts beats BAGUA_SSH_OPTS (set
# to an option ssh refuses); hosts with their own :PORT.
# shellcheck disable=SC2016
probe='echo "env rank=$RANK local=$LOCAL_RANK world=$WORLD_SIZE lws=$LOCAL_WORLD_SIZE'
probe+=' node=$NODE_RANK nnodes=$NNODES master=$MASTER_ADDR:$MASTER_PORT x=$BAGUA_TEST_X'
probe+=' key=$(printf %s "$BAGUA_JOB_KEY" | wc -c)/$(printf %s "$BAGUA_JOB_KEY" | md5sum | cut -c1-8)"'
probe+=' && exec "$0" "$@"'
BAGUA_SSH_OPTS="-o NoSuchOption=1" timeout 60 ip netns exec "$client" "$baguarun" \
  --ssh_opts "$sshopts" --host_list "${addrs[0]}:2222,${addrs[1]}:2222" --nproc_per_node 2 \
  --master_port 29530 -x BAGUA_TEST_X="a b'c" -- sh -c "$probe" "$trainer" --steps 30 \
  >"$tmp/out" 2>"$tmp/err"
rc=$?
[ "$rc" = 0 ] || fail "train: exited with $rc"
keys="$(grep -o 'key=[0-9]*/[0-9a-f]*' "$tmp/out" | sort -u)"
[ "$(echo "$keys" | wc -l)" = 1 ] && [ "${keys%%/*}" = "key=64" ] ||
  fail "train: want one 64-digit job key on every rank, got: $keys"
for r in 0 1 2 3; do
  h=$((r / 2)); l=$((r % 2))
  want="[${addrs[$h]}:2222] [rank $r] env rank=$r local=$l world=4 lws=2 node=$h nnodes=2"
  want+=" master=${addrs[0]}:29530 x=a b'c ${keys}"
  grep -qxF "$want" "$tmp/out" || fail "train: no line '$want'"
  want="^\[${addrs[$h]}:2222\] \[rank $r\] bagua-cpp-trainer: rank $r/4, gradient_allreduce, "
  grep -qE "$want.* 0 differ between ranks" "$tmp/out" || fail "train: no summary of rank $r"
done
expect_no_orphans 5 train
echo "ok: train: 4 ranks on 2 hosts trained; each had its variables, the -x value and the one job key, and every line arrived prefixed with its host and rank ($((SECONDS - t0)) s)"; t0=$SECONDS

# ---- sigint: Ctrl-C ends every remote rank ------------------------------------------------------
# The user's job key goes to the hosts through ssh's stdin: no command line may show it.
export BAGUA_JOB_KEY="sigint$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')"
printf '%s\n' "$BAGUA_JOB_KEY" >"$tmp/key"  # grep reads it from there, not its own arguments
start_long_run sigint
shown="$(grep -lF -f "$tmp/key" /proc/[0-9]*/cmdline 2>/dev/null)"
[ -z "$shown" ] || fail "sigint: the job key is on a command line: $shown"
unset BAGUA_JOB_KEY
kill -INT "$pid"
wait_baguarun 20 sigint
[ "$rc" = 130 ] || fail "sigint: exited with $rc, want 130"
grep -q "stopped by signal 2" "$tmp/err" || fail "sigint: no 'stopped by signal 2'"
expect_no_orphans 5 sigint
echo "ok: sigint: no command line showed the job key; baguarun exited 130 and no rank is left on either host ($((SECONDS - t0)) s)"; t0=$SECONDS

# ---- kill9: the hosts' ranks end with baguarun even when it is SIGKILLed -------------------------
start_long_run kill9
kill -9 "$pid"
wait "$pid" 2>/dev/null
expect_no_orphans 10 kill9
echo "ok: kill9: the hosts stopped their ranks when baguarun's end closed their stdin ($((SECONDS - t0)) s)"; t0=$SECONDS

# ---- refused: a host that cannot be reached -----------------------------------------------------
timeout 30 ip netns exec "$client" "$baguarun" --host_list "${addrs[0]},${addrs[1]}:2299" \
  --ssh_port 2222 --nproc_per_node 2 --master_port 29532 --grace_s 2 -- "$trainer" \
  --steps 1000000 >"$tmp/out" 2>"$tmp/err"
rc=$?
[ "$rc" != 0 ] && [ "$rc" != 124 ] || fail "refused: exited with $rc, want a failure"
grep -qF "baguarun: host ${addrs[1]}:2299 (node rank 1) cannot be reached over SSH" "$tmp/err" ||
  fail "refused: no error naming ${addrs[1]}:2299 as not reachable"
expect_no_orphans 5 refused
echo "ok: refused: exit $rc, the error names ${addrs[1]}:2299, the other host stopped its ranks ($((SECONDS - t0)) s)"; t0=$SECONDS

# ---- hostdies: the second host loses power mid-run ----------------------------------------------
start_long_run hostdies
for p in $(ip netns pids "${hosts[1]}"); do kill -9 "$p" 2>/dev/null; done
wait_baguarun 20 hostdies
[ "$rc" != 0 ] || fail "hostdies: exited with 0"
grep -qF "baguarun: host ${addrs[1]} (node rank 1) lost its connection while the job ran" \
  "$tmp/err" || fail "hostdies: no error naming ${addrs[1]} as lost"
expect_no_orphans 5 hostdies
echo "ok: hostdies: exit $rc within the bound, the error names ${addrs[1]}, no rank is left ($((SECONDS - t0)) s)"; t0=$SECONDS
