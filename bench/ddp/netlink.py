"""An emulated link per rank on CPU: one network namespace per rank, a veth into a bridge in a
hub namespace, and a ``tc htb`` rate cap on each rank's egress (the rank's send rate). Every
byte between ranks (torch's gloo, bagua's host backend, both stores) crosses the veths, so both
contestants share one link of the same speed. Addresses come from 198.18.0.0/15 (benchmark
range) inside namespaces this module creates and removes; nothing in the root namespace
changes. Needs root and iproute2.

    with Link(nproc=2, rate="10gbit") as link:
        link.prefix(rank)  # ["ip", "netns", "exec", <ns>] for the rank's command
        link.addr(rank)    # the rank's address
"""

import os
import shutil
import subprocess
import time

RATE_HELP = "a tc rate: 10gbit, 25gbit, 2500mbit, ..."


def parse_rate(rate):
    """bits/s of a tc rate string (kbit, mbit, gbit suffixes); ValueError names the format."""
    s = rate.strip().lower()
    for suffix, mult in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)):
        if s.endswith(suffix):
            try:
                v = float(s[: -len(suffix)])
            except ValueError:
                break
            if v > 0:
                return v * mult
    raise ValueError("--link {!r}: expected 'none' or {}".format(rate, RATE_HELP))


def _ip(*args, check=True):
    return subprocess.run(["ip"] + list(args), check=check, capture_output=True, text=True)


class Link:
    def __init__(self, nproc, rate, mtu=9000):
        if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
            raise RuntimeError("--link on CPU needs root and iproute2 (ip, tc): it builds one "
                               "network namespace per rank with a tc htb rate cap")
        self.nproc = nproc
        self.rate = rate
        self.bits = parse_rate(rate)
        self.mtu = mtu
        tag = "bd{}".format(os.getpid() % 100000)
        self.hub = tag + "h"
        self.ns = ["{}r{}".format(tag, r) for r in range(nproc)]
        self.tag = tag
        self._made = []

    def addr(self, rank):
        return "198.18.{}.{}".format(rank // 250, rank % 250 + 1)

    def prefix(self, rank):
        return ["ip", "netns", "exec", self.ns[rank]]

    def __enter__(self):
        try:
            self._up()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def _up(self):
        _ip("netns", "add", self.hub)
        self._made.append(self.hub)
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "link", "set", "br0", "mtu", str(self.mtu), "up")
        for r, ns in enumerate(self.ns):
            _ip("netns", "add", ns)
            self._made.append(ns)
            a, b = "{}a{}".format(self.tag, r), "{}b{}".format(self.tag, r)
            _ip("link", "add", a, "mtu", str(self.mtu), "netns", ns, "type", "veth", "peer",
                "name", b, "mtu", str(self.mtu), "netns", self.hub)
            _ip("-n", ns, "link", "set", a, "name", "eth0")
            _ip("-n", ns, "addr", "add", self.addr(r) + "/16", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", self.hub, "link", "set", b, "master", "br0", "up")
            # Egress cap: the rank sends at most `rate` (burst: 1 ms of the rate, >= 64 KiB).
            burst = max(64 * 1024, int(self.bits / 8 / 1000))
            tc = ["ip", "netns", "exec", ns, "tc"]
            subprocess.run(tc + ["qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb",
                                 "default", "1"], check=True, capture_output=True)
            subprocess.run(tc + ["class", "add", "dev", "eth0", "parent", "1:", "classid", "1:1",
                                 "htb", "rate", self.rate, "ceil", self.rate, "burst",
                                 str(burst), "cburst", str(burst)], check=True,
                           capture_output=True)

    def close(self):
        for ns in reversed(self._made):
            _ip("netns", "del", ns, check=False)
        self._made = []

    def measure(self, seconds=1.0):
        """Bytes/s one TCP stream gets from rank 1 to rank 0 over the link (a sanity figure:
        what the shaped veth delivers on this machine)."""
        if self.nproc < 2:
            return 0.0
        port = 39999
        srv = subprocess.Popen(self.prefix(0) + [
            "python3", "-c",
            "import socket,sys\n"
            "s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
            "s.bind(('{}',{}));s.listen(1);c,_=s.accept();n=0\n"
            "while True:\n"
            "  b=c.recv(1<<20)\n"
            "  if not b: break\n"
            "  n+=len(b)\n"
            "print(n)".format(self.addr(0), port)], stdout=subprocess.PIPE, text=True)
        time.sleep(0.3)
        out = subprocess.run(self.prefix(1) + [
            "python3", "-c",
            "import socket,time\n"
            "c=socket.create_connection(('{}',{}));b=bytes(1<<20);t=time.time();n=0\n"
            "while time.time()-t<{}:\n"
            "  c.sendall(b);n+=len(b)\n"
            "c.close();print(time.time()-t)".format(self.addr(0), port, seconds)],
            capture_output=True, text=True, timeout=30)
        got, _ = srv.communicate(timeout=30)
        try:
            return int(got.strip()) / float(out.stdout.strip())
        except ValueError:
            return 0.0
