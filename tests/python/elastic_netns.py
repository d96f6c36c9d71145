"""Nodes as network namespaces for the elastic tests.

``Nodes(n)`` makes namespaces b20<tag>n<i> with veths on one bridge, addresses
198.18.<subnet>.<i+1>/24 (the benchmarking range), each with its own host name node<i> (a UTS
namespace per process started in it) and an /etc/hosts (``ip netns exec`` mounts
/etc/netns/<ns>/hosts over /etc/hosts) that resolves every node's name to its address, as a
cluster's DNS would: torchrun's agent publishes its host name as MASTER_ADDR. Everything is
removed on exit. ``Nodes.refused()`` says why the machine cannot make them (the tests skip with
that reason).
"""

import os
import shutil
import signal
import subprocess
import time


def _sh(*cmd):
    return subprocess.run(list(cmd), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


class Nodes:
    def __init__(self, n):
        self.n = n
        self.tag = str(os.getpid() % 100000)
        self.subnet = os.getpid() % 200 + 20
        self.made = 0
        self.bridge = None
        self.procs = []

    def name(self, i):
        return "b20{}n{}".format(self.tag, i)

    def host(self, i):
        return "node{}".format(i)

    def addr(self, i):
        return "198.18.{}.{}".format(self.subnet, i + 1)

    def refused(self):
        """Makes the namespaces; returns None, or why the machine refused."""
        if os.geteuid() != 0:
            return "not root: network namespaces need CAP_NET_ADMIN"
        if shutil.which("ip") is None or shutil.which("unshare") is None:
            return "ip (iproute2) or unshare (util-linux) is missing"
        br = "b20{}br".format(self.tag)
        if _sh("ip", "link", "add", br, "type", "bridge").returncode != 0:
            return "cannot make a bridge: ip link add type bridge refused"
        self.bridge = br
        _sh("ip", "link", "set", br, "up")
        hosts = "127.0.0.1 localhost\n" + "".join(
            "{} {}\n".format(self.addr(i), self.host(i)) for i in range(self.n))
        for i in range(self.n):
            ns, h, v = self.name(i), "b20{}h{}".format(self.tag, i), "b20{}v{}".format(self.tag, i)
            r = _sh("ip", "netns", "add", ns)
            if r.returncode != 0:
                return "ip netns add refused: " + r.stderr.decode().strip()
            self.made = i + 1
            os.makedirs("/etc/netns/" + ns, exist_ok=True)
            with open("/etc/netns/{}/hosts".format(ns), "w") as f:
                f.write(hosts)
            for cmd in (["ip", "link", "add", h, "type", "veth", "peer", "name", v],
                        ["ip", "link", "set", v, "netns", ns],
                        ["ip", "link", "set", h, "master", br, "up"],
                        ["ip", "-n", ns, "link", "set", "lo", "up"],
                        ["ip", "-n", ns, "addr", "add", self.addr(i) + "/24", "dev", v],
                        ["ip", "-n", ns, "link", "set", v, "up"]):
                r = _sh(*cmd)
                if r.returncode != 0:
                    return "cannot wire {} ({}): {}".format(ns, " ".join(cmd),
                                                            r.stderr.decode().strip())
        return None

    def start(self, i, argv, env, log):
        """Starts argv on node i (own host name, own session) with output to the file log."""
        cmd = ["ip", "netns", "exec", self.name(i), "unshare", "--uts", "sh", "-c",
               'hostname "$0" && exec "$@"', self.host(i)] + list(argv)
        out = open(log, "ab")
        p = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=True)
        p.node = i
        self.procs.append(p)
        return p

    def kill_node(self, i):
        """SIGKILL every process of node i (the agent and its workers), as a power cut would."""
        pids = subprocess.run(["ip", "netns", "pids", self.name(i)], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in self.procs:
            if p.node == i:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for i in range(self.made):
            for pid in subprocess.run(["ip", "netns", "pids", self.name(i)],
                                      stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        time.sleep(0.2)
        for i in range(self.made):
            _sh("ip", "netns", "del", self.name(i))
            shutil.rmtree("/etc/netns/" + self.name(i), ignore_errors=True)
        self.made = 0
        if self.bridge:
            _sh("ip", "link", "del", self.bridge)
            self.bridge = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
