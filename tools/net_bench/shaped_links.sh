#!/usr/bin/env bash
# Two network namespaces joined by shaped veth links: the fixture of the Bagua-Net link tests and
# of `bagua-net-bench --netns`. Needs root (ip netns, tc); htb and u32 only (no netem).
#
#   shaped_links.sh up NAME [--mtu BYTES] LINK...    make NAME-a and NAME-b
#   shaped_links.sh down NAME                        remove them (and their links)
#   shaped_links.sh sweep                            remove bl<pid>-a/-b whose process is gone
#   shaped_links.sh check                            exit 0 if namespaces can be made here
#
# LINK is RATE or RATE/F: a tc rate (4gbit, 500mbit). Link k (0-based) is a veth pair named bn<k>
# in both namespaces, 198.18.<k>.1/24 in NAME-a and 198.18.<k>.2/24 in NAME-b (198.18.0.0/15 is
# the benchmarking range, RFC 2544). Both directions are shaped on egress with htb:
#   RATE      one class of RATE: a link of that line rate;
#   RATE/F    a parent class of RATE whose 256 leaf classes (rate RATE/256, ceil RATE/F) take TCP
#             segments by the low byte of their source port (u32 hash): every flow is capped at
#             RATE/F, all flows together at RATE (per-flow caps as clouds apply them; two flows
#             share a cap only when their ports collide in that byte, 1 in 256).
# The leaves' guaranteed rates add up to the parent's exactly: htb lets a class below its own
# rate send without asking its parent, so larger leaf rates would lift the total above RATE.
# Names: NAME-a/-b must fit `ip netns`; veth names are bn<k> inside the namespaces only.
set -euo pipefail

die() { echo "shaped_links.sh: $*" >&2; exit 2; }

# tc rate text -> bits/s (integer), for the per-flow arithmetic.
rate_bits() {
  local t="${1,,}" n unit
  n="${t%%[a-z]*}"; unit="${t#"$n"}"
  [[ "$n" =~ ^[0-9]+$ ]] || die "bad rate '$1' (expected e.g. 4gbit, 500mbit)"
  case "$unit" in
    gbit) echo $((n * 1000000000)) ;;
    mbit) echo $((n * 1000000)) ;;
    kbit) echo $((n * 1000)) ;;
    bit) echo "$n" ;;
    *) die "bad rate unit in '$1' (accepted: gbit, mbit, kbit, bit)" ;;
  esac
}

# htb bucket for a class of RATE bits/s: 1 ms of it, at least one 64 KiB GSO segment plus
# headers (tc's default, rate/HZ + MTU, is ~1.5 KB with high-resolution timers: smaller than the
# segments veth carries, and htb then falls short of its rate).
bucket() { local b=$(($1 / 8000)); [ "$b" -ge 68000 ] || b=68000; echo "$b"; }

shape() {  # shape NS DEV RATE [FLOWS]
  local ns="$1" dev="$2" rate="$3" flows="${4:-}" batch
  batch="$(mktemp)"
  local total; total=$(rate_bits "$rate")
  local tb; tb=$(bucket "$total")
  {
    if [ -z "$flows" ]; then
      echo "qdisc add dev $dev root handle 1: htb default 1"
      echo "class add dev $dev parent 1: classid 1:1 htb rate ${total}bit ceil ${total}bit burst $tb cburst $tb quantum 65536"
    else
      local leaf=$((total / 256)) cap=$((total / flows)) i lb
      lb=$(bucket "$cap")
      # Non-TCP traffic (ARP, ICMP) goes to class 1:2, which shares the parent like a flow.
      echo "qdisc add dev $dev root handle 1: htb default 2"
      echo "class add dev $dev parent 1: classid 1:1 htb rate ${total}bit ceil ${total}bit burst $tb cburst $tb quantum 65536"
      echo "class add dev $dev parent 1:1 classid 1:2 htb rate ${leaf}bit ceil ${cap}bit burst $lb cburst $lb quantum 65536"
      for i in $(seq 0 255); do
        printf 'class add dev %s parent 1:1 classid 1:%x htb rate %dbit ceil %dbit burst %d cburst %d quantum 65536\n' \
          "$dev" $((0x100 + i)) "$leaf" "$cap" "$lb" "$lb"
      done
      echo "filter add dev $dev parent 1: prio 1 handle 2: protocol ip u32 divisor 256"
      # Bytes 20..23 of an IPv4 packet without options: TCP source and destination port; the
      # mask takes the source port's low byte as the bucket.
      echo "filter add dev $dev parent 1: prio 1 protocol ip u32 ht 800:: match ip protocol 6 0xff hashkey mask 0x00ff0000 at 20 link 2:"
      for i in $(seq 0 255); do
        printf 'filter add dev %s parent 1: prio 1 protocol ip u32 ht 2:%x: match u32 0 0 flowid 1:%x\n' \
          "$dev" "$i" $((0x100 + i))
      done
    fi
  } > "$batch"
  ip netns exec "$ns" tc -batch "$batch" || { rm -f "$batch"; die "tc failed on $ns/$dev"; }
  rm -f "$batch"
}

cmd="${1:-}"; shift || true
case "$cmd" in
  check)
    probe="blcheck$$"
    ip netns add "$probe" 2>/dev/null || { echo "ip netns add refused (not root, or no netns support)"; exit 1; }
    ip netns del "$probe"
    command -v tc > /dev/null || { echo "tc not found (iproute2)"; exit 1; }
    ;;
  up)
    name="${1:-}"; shift || true
    [ -n "$name" ] || die "up: missing NAME"
    mtu=1500; links=()
    while [ $# -gt 0 ]; do
      case "$1" in
        --mtu) mtu="${2:?--mtu needs a value}"; shift 2 ;;
        *) links+=("$1"); shift ;;
      esac
    done
    [ ${#links[@]} -ge 1 ] || die "up: give at least one LINK (e.g. 4gbit or 4gbit/8)"
    [ ${#links[@]} -le 16 ] || die "up: at most 16 links"
    a="$name-a"; b="$name-b"
    ip netns add "$a"; ip netns add "$b"
    trap 'ip netns del "$a" 2>/dev/null; ip netns del "$b" 2>/dev/null' ERR
    ip -n "$a" link set lo up; ip -n "$b" link set lo up
    for k in "${!links[@]}"; do
      spec="${links[$k]}"; rate="${spec%%/*}"; flows=""
      [ "$spec" != "$rate" ] && flows="${spec#*/}"
      [ -z "$flows" ] || [[ "$flows" =~ ^[1-9][0-9]*$ ]] || die "bad flow count in '$spec'"
      rate_bits "$rate" > /dev/null
      ip link add "bl$$x$k" netns "$a" mtu "$mtu" type veth peer name "bl$$y$k" netns "$b" mtu "$mtu"
      ip -n "$a" link set "bl$$x$k" name "bn$k"; ip -n "$b" link set "bl$$y$k" name "bn$k"
      ip -n "$a" addr add "198.18.$k.1/24" dev "bn$k"; ip -n "$b" addr add "198.18.$k.2/24" dev "bn$k"
      ip -n "$a" link set "bn$k" up; ip -n "$b" link set "bn$k" up
      shape "$a" "bn$k" "$rate" "$flows"; shape "$b" "bn$k" "$rate" "$flows"
    done
    # The plugin takes only running interfaces: wait until every link's carrier is up on both
    # sides (a veth pair reports it a few milliseconds after `link set up`).
    for k in "${!links[@]}"; do
      for ns in "$a" "$b"; do
        for _ in $(seq 1 100); do
          ip -n "$ns" link show "bn$k" | grep -q 'state UP' && break
          sleep 0.05
        done
        ip -n "$ns" link show "bn$k" | grep -q 'state UP' || die "bn$k in $ns did not come up"
      done
    done
    trap - ERR
    ;;
  down)
    name="${1:-}"
    [ -n "$name" ] || die "down: missing NAME"
    ip netns del "$name-a" 2>/dev/null || true
    ip netns del "$name-b" 2>/dev/null || true
    ;;
  sweep)
    for ns in $(ip netns list | awk '{print $1}'); do
      if [[ "$ns" =~ ^bl([0-9]+)-[ab]$ ]] && [ ! -d "/proc/${BASH_REMATCH[1]}" ]; then
        ip netns del "$ns" 2>/dev/null || true
      fi
    done
    ;;
  *)
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
    [ "$cmd" = "help" ] || [ "$cmd" = "--help" ] || exit 2
    ;;
esac
