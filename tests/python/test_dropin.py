"""Drop-in Bagua, single process: Redis stores over real redis-server processes,
the cached dataset on a multi-server layout, utils, checkpoint, the algorithm registry, the
launchers' command lines."""

import os
import shutil
import socket
import subprocess
import time

import pytest
import torch

from bagua.torch_api import algorithms, utils
from bagua.torch_api.contrib import CachedDataset, CacheLoader
from bagua.torch_api.contrib.utils.redis_store import RedisStore, start_redis_server_cli
from bagua.torch_api.contrib.utils.store import ClusterStore, Store

needs_redis = pytest.mark.skipif(shutil.which("redis-server") is None,
                                 reason="redis-server is not installed")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _redis_cmd(port, *words, timeout=5.0):
    """One command over RESP (no client library needed); returns the raw reply."""
    payload = "*{}\r\n".format(len(words)) + "".join(
        "${}\r\n{}\r\n".format(len(w), w) for w in words)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(payload.encode())
        try:
            return s.recv(65536)
        except OSError:
            return b""


@pytest.fixture
def redis_servers():
    """Three real redis-server processes (Bagua's start_redis_server_cli), shut down after."""
    ports = []
    try:
        for _ in range(3):
            port = _free_port()
            start_redis_server_cli(port, 10_000_000)
            ports.append(port)
        deadline = time.time() + 10
        for port in ports:
            while True:
                try:
                    if _redis_cmd(port, "PING").startswith(b"+PONG"):
                        break
                except OSError:
                    pass
                assert time.time() < deadline, "redis-server on {} did not start".format(port)
                time.sleep(0.05)
        yield ports
    finally:
        for port in ports:
            try:
                _redis_cmd(port, "SHUTDOWN", "NOSAVE", timeout=2)
            except OSError:
                pass


def _dbsize(port):
    reply = _redis_cmd(port, "DBSIZE")
    assert reply.startswith(b":"), reply
    return int(reply[1:].strip())


def _check_store(store):
    """Bagua's RedisStore test (tests/contrib/test_store.py: check), on our store."""
    store.clear()
    assert store.num_keys() == 0
    data = [torch.randn(10).numpy().tobytes() for _ in range(5)]
    store.set("1", data[1])
    store.mset({"2": data[2], "3": data[3], "4": data[4]})
    assert store.mget(["1", "2", "5"]) == [data[1], data[2], None]
    assert store.get("4") == data[4] and store.get("6") is None
    assert store.num_keys() == 4
    assert store.status()


@needs_redis
def test_redis_store_cluster_mode_shards_over_servers(redis_servers):
    hosts = [{"host": "127.0.0.1", "port": p} for p in redis_servers]
    store = RedisStore(hosts=hosts, cluster_mode=True)
    _check_store(store)
    store.mset({"k{}".format(i): b"v" for i in range(60)})
    sizes = [_dbsize(p) for p in redis_servers]
    assert sum(sizes) == 64 and all(s > 0 for s in sizes), sizes  # every server holds keys


@needs_redis
def test_redis_store_without_cluster_mode_uses_one_server(redis_servers, monkeypatch):
    monkeypatch.setenv("NODE_RANK", "1")  # node n uses server n % len(hosts), as in Bagua
    hosts = [{"host": "127.0.0.1", "port": p} for p in redis_servers]
    store = RedisStore(hosts=hosts, cluster_mode=False)
    _check_store(store)
    assert [_dbsize(p) for p in redis_servers] == [0, 4, 0]


@needs_redis
def test_redis_store_spawns_local_servers():
    store = RedisStore(hosts=None, cluster_mode=False, capacity_per_node=10_000_000)
    _check_store(store)


@needs_redis
def test_cached_dataset_on_multi_server_redis(redis_servers):
    """Bagua's CachedDataset test (two datasets, one store) on a 3-server sharded layout:
    served from the cache after the first pass, keys spread over every server."""

    class Counting(torch.utils.data.Dataset):
        def __init__(self, n, tag):
            self.n, self.tag, self.reads = n, tag, 0

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            self.reads += 1
            return (self.tag, i, torch.full((2,), float(i)))

    hosts = [{"host": "127.0.0.1", "port": p} for p in redis_servers]
    d1, d2 = Counting(102, "a"), Counting(102, "b")
    c1 = CachedDataset(d1, backend="redis", dataset_name="d1", hosts=hosts, cluster_mode=True)
    c2 = CachedDataset(d2, backend="redis", dataset_name="d2", hosts=hosts, cluster_mode=True)
    assert c1.cache_loader.store is c2.cache_loader.store  # one store per configuration
    c1.cache_loader.store.clear()
    for epoch in range(3):
        for c, d in ((c1, d1), (c2, d2)):
            for i in range(len(c)):
                tag, j, x = c[i]
                assert (tag, j) == (d.tag, i) and torch.equal(x, torch.full((2,), float(i)))
            if epoch == 0:
                c.cache_loader.flush()  # the last 2 of 102 wait in the writer buffer otherwise
    assert d1.reads == 102 and d2.reads == 102
    assert c2.cache_loader.num_keys() == 204
    sizes = [_dbsize(p) for p in redis_servers]
    assert sum(sizes) == 204 and all(s > 0 for s in sizes), sizes
    # cluster_mode=False: one server for this node (NODE_RANK unset: 0).
    loader = CacheLoader(backend="redis", hosts=hosts, cluster_mode=False, dataset_name="one")
    loader.store.clear()
    for i in range(10):
        assert loader.get(i, lambda k: k * 3) == i * 3
    assert loader.num_keys() == 10 and _dbsize(redis_servers[0]) == 10
    for c in (c1, c2, loader):
        c.flush() if hasattr(c, "flush") else c.cache_loader.flush()  # before the servers stop


def test_cluster_store_routes_by_key():
    class Dict(Store):
        def __init__(self):
            self.d = {}

        def set(self, k, v):
            self.d[k] = v

        def get(self, k):
            return self.d.get(k)

        def num_keys(self):
            return len(self.d)

        def clear(self):
            self.d.clear()

        def status(self):
            return True

    parts = [Dict(), Dict(), Dict()]
    c = ClusterStore(parts)
    _check_store(c)
    c.mset({"key{}".format(i): b"x" for i in range(90)})
    assert sum(p.num_keys() for p in parts) == 94 and all(p.num_keys() for p in parts)
    for i in range(90):
        assert c.route("key{}".format(i)).get("key{}".format(i)) == b"x"


def test_statistical_average():
    """Bagua's tests/torch_api/test_utils.py, with the clock stubbed instead of a sleep."""
    import numpy as np

    now = [1000.0]
    real = utils.time.time
    utils.time.time = lambda: now[0]
    try:
        m = utils.StatisticalAverage(last_update_time=now[0],
                                     records=[5.0, 4.5005175, 3.5034241850204078],
                                     record_tail=(2.0166309999999985, 2.499061185570463))
        now[0] += 1.0
        m.record(6.0)
        for n, want in [(1.0, 6.0), (2.0, (6.0 + 5.0) / 2.0),
                        (3.0, (6.0 + 4.5005175 * 2.0) / 3.0),
                        (5.0, (6.0 + 3.5034241850204078 * 4.0) / 5.0),
                        (7.0, (6.0 + 2.499061185570463 * (4.0 + 2.0166309999999985)) / 7.0)]:
            assert np.isclose(m.get_records_mean(n), want, atol=0.1), (n, m)
        assert np.isclose(m.total_recording_time(), 4.0 + 2.0166309999999985 + 1, atol=0.1)
        assert m.get(0.5) == m.records[0]
    finally:
        utils.time.time = real


def test_flatten_helpers():
    ts = [torch.arange(3.0), torch.arange(4.0).view(2, 2)]
    flat = utils.flatten(ts)
    assert torch.equal(flat, torch.tensor([0.0, 1, 2, 0, 1, 2, 3]))
    back = utils.unflatten(flat, ts)
    assert all(torch.equal(a, b) for a, b in zip(back, ts))
    buf = torch.zeros(7)
    assert utils.check_contiguous([buf[:3], buf[3:]]) and not utils.check_contiguous([buf[3:],
                                                                                      buf[:3]])
    assert torch.equal(utils.get_flattened_tensor(ts), flat)
    assert utils.to_bagua_datatype(torch.float16) == "f16"
    with pytest.raises(ValueError):
        utils.to_bagua_datatype(torch.int8)
    bucket = [torch.ones(2), torch.full((3,), 2.0)]
    utils.apply_flattened_call(bucket, lambda t: t.mul_(3))
    assert torch.equal(bucket[1], torch.full((3,), 6.0))


def test_checkpoint_round_trip(tmp_path):
    from bagua.torch_api.checkpoint import load_checkpoint, save_checkpoint

    m = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(m.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    m(torch.ones(1, 3)).sum().backward()
    opt.step()
    sched.step()
    save_checkpoint(7, str(tmp_path), m, opt, sched)
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "7"
    assert (tmp_path / "iter_0000007" / "mp_rank_00_model_states.pt").is_file()
    m2 = torch.nn.Linear(3, 2)
    opt2 = torch.optim.Adam(m2.parameters())
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, 1)
    assert load_checkpoint(str(tmp_path), m2, opt2, sched2) == 7
    assert all(torch.equal(a, b) for a, b in zip(m.parameters(), m2.parameters()))
    assert opt2.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]
    assert sched2.last_epoch == 1
    assert load_checkpoint(str(tmp_path / "none"), m2) == 0


def test_registry_and_user_algorithm_registration():
    reg = algorithms.GlobalAlgorithmRegistry
    assert reg.available_algorithms()[:6] == ["gradient_allreduce", "bytegrad", "decentralized",
                                              "low_precision_decentralized", "qadam", "async"]
    assert reg["bytegrad"]["description"] == "ByteGrad Algorithm"
    with pytest.raises(KeyError):
        reg.get("nope")
    with pytest.raises(ValueError):
        reg.register("bytegrad", object)

    class Mine(algorithms.Algorithm):
        def __init__(self, k=1):
            self.k = k

        def reify(self, process_group):
            return algorithms.AlgorithmImpl(process_group)

    reg.register("mine_for_test", Mine, description="a user algorithm")
    try:
        assert isinstance(algorithms.Algorithm.init("mine_for_test", k=3), Mine)
    finally:
        del reg["mine_for_test"]
    # The built-ins reify to AlgorithmImpl subclasses with Bagua's names.
    from bagua.torch_api.algorithms import bytegrad, gradient_allreduce

    impl = gradient_allreduce.GradientAllReduceAlgorithm(hierarchical=True).reify(None)
    assert isinstance(impl, gradient_allreduce.GradientAllReduceAlgorithmImpl)
    assert isinstance(impl, algorithms.AlgorithmImpl) and impl.hierarchical is True
    impl = bytegrad.ByteGradAlgorithmImpl(None, hierarchical=False, average=False)
    assert impl.average is False


def test_tensor_methods():
    p = torch.nn.Parameter(torch.ones(3))
    assert not p.is_bagua_tensor()
    p.bagua_ensure_grad()
    assert torch.equal(p.grad, torch.zeros(3))
    p.ensure_bagua_tensor("w", "mod", getter_closure=lambda t: t.grad,
                          setter_closure=lambda t, g: setattr(t, "grad", g))
    assert p.is_bagua_tensor() and p.bagua_tensor_name == "w"
    assert p.bagua_backend_tensor() is p.grad
    p.bagua_setter_closure(torch.full((3,), 2.0))
    assert torch.equal(p.bagua_getter_closure(), torch.full((3,), 2.0))
    store = torch.arange(10.0)
    p.bagua_set_storage(store.storage(), 4)
    assert torch.equal(p.grad, torch.tensor([4.0, 5.0, 6.0]))
    with pytest.raises(ValueError):
        p.ensure_bagua_tensor("other", "mod")
    t = torch.zeros(2).to_bagua_tensor("t")
    assert t.is_bagua_tensor() and t.bagua_backend_tensor() is t


def test_calculate_mutual_groups():
    """Bagua's case (tests/contrib/test_fused_optimizer.py): runs contiguous in every list."""
    from bagua.torch_api.contrib.fuse.optimizer import calculate_mutual_groups

    t = torch.rand(100)
    piece = [t[i * 10:(i + 1) * 10] for i in range(10)]
    g1 = [piece[3], piece[1], piece[2], piece[0], piece[8], piece[9], torch.rand(10)]
    g2 = [torch.rand(10) for _ in g1]
    g3 = [piece[3], piece[1], piece[2], piece[0], torch.rand(10), torch.rand(10), torch.rand(10)]
    g4 = [torch.rand(10), piece[1], piece[2], piece[0], piece[8], piece[9], torch.rand(10)]
    assert calculate_mutual_groups([g1, g2]) == []
    assert calculate_mutual_groups([g1, g3]) == [[3, 1, 2, 0]]
    assert calculate_mutual_groups([g1, g4]) == [[4, 5]]
    assert calculate_mutual_groups([g1, g1]) == [[3, 1, 2, 0], [4, 5]]


def test_cached_dataset_iterates_like_a_sequence():
    """for x in dataset: the source's IndexError ends the iteration (it is re-raised as is,
    not wrapped), as Bagua's test iterates its CachedDataset."""
    c = CachedDataset([10, 20, 30], backend="embedded", dataset_name="seq")
    assert [x for x in c] == [10, 20, 30]
    with pytest.raises(IndexError):
        c[3]


def test_store_server_on_a_busy_port_says_so():
    """Our equivalent of torch's TCPStore address-in-use test that Bagua's tree carries: the
    core store server that init_process_group starts names the cause and the fix."""
    from bagua.torch_api._ext import ext

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        with pytest.raises(RuntimeError, match="Address already in use.*MASTER_PORT"):
            ext.start_store_server("127.0.0.1", s.getsockname()[1])


def test_single_process_without_a_launcher(tmp_path):
    """python script.py with no launcher variables: init works (world of one, a free port),
    torch.distributed too, and the group can be destroyed and made again."""
    import sys

    script = tmp_path / "one.py"
    script.write_text(
        "import torch, torch.distributed as dist, bagua.torch_api as bagua\n"
        "for _ in range(2):\n"
        "    bagua.init_process_group()\n"
        "    t = torch.ones(3)\n"
        "    bagua.allreduce_inplace(t)\n"
        "    assert t.tolist() == [1.0] * 3 and dist.get_world_size() == 1\n"
        "    bagua.destroy_process_group()\n"
        "    assert not dist.is_initialized() and not bagua.is_initialized()\n"
        "print('OK', bagua.get_rank(), bagua.get_world_size())\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                        "MASTER_PORT")}
    p = subprocess.run([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=120)
    assert p.returncode == 0 and b"OK 0 1" in p.stdout, p.stdout.decode()[-3000:]
