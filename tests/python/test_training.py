"""Training the Bagua test model with each algorithm in several processes over loopback."""

import pytest
import torch

import comm_checks
import harness

# Every 2-rank scenario runs in one launch of 2 processes (importing torch dominates the time
# on a loaded 2-core machine); each test checks its own scenario.
SCENARIOS_2 = {
    "gar_with_bagua_flat": {"algorithm": "gradient_allreduce", "steps": 10, "reference": True,
                            "wrapper": "with_bagua", "do_flatten": True},
    "gar_with_bagua_noflat": {"algorithm": "gradient_allreduce", "steps": 10, "reference": True,
                              "wrapper": "with_bagua", "do_flatten": False},
    "gar_ddp": {"algorithm": "gradient_allreduce", "steps": 10, "reference": True,
                "wrapper": "ddp"},
    # BAGUA_AUTOTUNE on for this wrap (the tuner's windows shortened by the launch's env).
    "gar_autotune": {"algorithm": "gradient_allreduce", "steps": 40, "reference": True,
                     "wrapper": "with_bagua", "autotune": True},
    "no_sync": {"algorithm": "gradient_allreduce", "steps": 6, "accumulate": 2},
    "bytegrad": {"algorithm": "bytegrad", "steps": 10, "reference": True,
                 "kwargs": {"hierarchical": False}},
    "decentralized": {"algorithm": "decentralized", "steps": 8,
                      "kwargs": {"hierarchical": False, "peer_selection_mode": "all"}},
    "qadam_warmup": {"algorithm": "qadam", "steps": 8, "lr": 1e-2,
                     "kwargs": {"opt": {"warmup_steps": 100}, "algo": {"hierarchical": False}}},
    "qadam_compressed": {"algorithm": "qadam", "steps": 12, "lr": 1e-2,
                         "kwargs": {"opt": {"warmup_steps": 4}, "algo": {"hierarchical": False}}},
    # Bagua #654 "QAdam NaN": the default eps (1e-8) on a model with units that get no gradient
    # through the warm-up. hold_zero_variance=True (our option) keeps it training; the default
    # (False) is Bagua's exact update, which diverges here.
    "qadam_default_eps": {"algorithm": "qadam", "steps": 16, "lr": 1e-2,
                          "kwargs": {"opt": {"warmup_steps": 4, "hold_zero_variance": True},
                                     "algo": {"hierarchical": False}}},
    "qadam_default_eps_nohold": {"algorithm": "qadam", "steps": 16, "lr": 1e-2,
                                 "kwargs": {"opt": {"warmup_steps": 4},
                                            "algo": {"hierarchical": False}}},
    # QAdam built from parameter groups (one per parameter, reverse order): the same run as
    # qadam_compressed, bit for bit.
    "qadam_compressed_groups": {"algorithm": "qadam", "steps": 12, "lr": 1e-2,
                                "kwargs": {"opt": {"warmup_steps": 4},
                                           "algo": {"hierarchical": False}, "groups": True}},
    "async": {"algorithm": "async", "steps": 30,
              "kwargs": {"sync_interval_ms": 5, "warmup_steps": 3}},
}


@pytest.fixture(scope="module")
def runs2():
    items = {k: {"func": "train", "args": v} for k, v in SCENARIOS_2.items()}
    items["comm"] = {"func": "comm_basic"}
    items["comm_bagua"] = {"func": "comm_bagua"}
    items["dropin"] = {"func": "dropin"}
    items["relayout"] = {"func": "relayout", "args": {"set_to_none": False}}
    items["relayout_none"] = {"func": "relayout", "args": {"set_to_none": True}}
    items["syncbn"] = {"func": "syncbn"}
    items["broadcast_state"] = {"func": "broadcast_state"}
    items["features2"] = {"func": "features2"}
    items["features"] = {"func": "features"}  # last: it aborts the group on purpose
    # Launched by baguarun (the launcher is part of what is tested); the world-3 run below is
    # spawned directly with torchrun's variables, as torchrun would.
    # The tuner's parameters (read only where a wrap is autotuned: gar_autotune): no warm-up,
    # one 2-iteration window per setting, 6 settings.
    tune = {"BAGUA_AUTOTUNE_WARMUP_TIME_S": "0", "BAGUA_AUTOTUNE_SAMPLING_CONFIDENCE_TIME_S": "0",
            "BAGUA_AUTOTUNE_CHECK_INTERVAL": "2", "BAGUA_AUTOTUNE_MAX_SAMPLES": "6"}
    outs = harness.run("bundle", 2, {"items": items}, timeout=240, launcher="baguarun", env=tune)
    return {k: [o[k] for o in outs] for k in items}


def test_collectives_world2(runs2):
    comm_checks.check_collectives(runs2["comm"], 2)


def test_bagua_communication_api_world2(runs2):
    comm_checks.check_bagua_api(runs2["comm_bagua"], 2)


def _assert_ranks_equal(outs, key="final"):
    for o in outs[1:]:
        assert torch.equal(o[key], outs[0][key])


@pytest.mark.parametrize("scenario", ["gar_with_bagua_flat", "gar_with_bagua_noflat", "gar_ddp"])
def test_gradient_allreduce_equals_single_process(runs2, scenario):
    # DDP equivalence: 2 ranks with different batches == one process on the concatenated batch,
    # starting from rank 0's weights (every rank starts from different ones).
    outs = runs2[scenario]
    wrapper = SCENARIOS_2[scenario]["wrapper"]
    assert torch.equal(outs[0]["init"], outs[1]["init"])  # broadcast at wrap
    _assert_ranks_equal(outs)
    assert torch.allclose(outs[0]["final"], outs[0]["reference"], rtol=1e-5, atol=1e-6)
    assert not torch.equal(outs[0]["final"], outs[0]["init"])
    keys = outs[0]["state_dict_keys"]
    if wrapper == "ddp":
        assert keys == ["module.fc1.weight", "module.fc2.weight", "module.fc2.bias",
                        "module.fc3.weight"]
    else:
        assert keys == ["fc1.weight", "fc2.weight", "fc2.bias", "fc3.weight"]
    # DDP-style unwrap loops (while hasattr(m, "module"): m = m.module) end: one hop for the
    # DDP wrapper, none for with_bagua (no self-referencing .module, as in Bagua), and the
    # unwrapped state has the plain model's keys.
    # do_flatten (with_bagua's default, gradient_as_bucket_view for the DDP wrapper) lays the
    # gradients out in bucket order and the reducer runs every bucket in place there: no copy
    # into reducer storage and none back; the gradients the optimizer reads are the layout.
    in_place, buckets = outs[0]["in_place"]
    if scenario == "gar_with_bagua_noflat":
        assert in_place == 0 and outs[0]["grads_at_layout"] == (0, 0)
    else:
        assert buckets >= 1 and in_place == buckets, outs[0]["in_place"]
        assert outs[0]["grads_at_layout"] == (4, 4)
    assert outs[0]["unwrap_hops"] == (1 if wrapper == "ddp" else 0)
    assert outs[0]["unwrapped_state_dict_keys"] == ["fc1.weight", "fc2.weight", "fc2.bias",
                                                    "fc3.weight"]


@pytest.mark.parametrize("key", ["relayout", "relayout_none"])
def test_laid_out_gradients_follow_the_rebuilt_buckets(runs2, key):
    # The model's head is registered first and used last, so the reducer's rebuild in
    # gradient-ready order (before the second forward) no longer lines up with the wrap's
    # layout; the wrap lays its gradients out again per bucket and every bucket runs in place
    # from then on. Training is unchanged: single-process training on every rank's batch, with
    # zero_grad() keeping the gradients or dropping them (set_to_none).
    outs = runs2[key]
    _assert_ranks_equal(outs)
    assert torch.allclose(outs[0]["final"], outs[0]["reference"], rtol=1e-5, atol=1e-6)
    seen = outs[0]["seen"]
    assert outs[0]["layout"][0][:2] == ["head.bias", "head.weight"]  # ready order
    assert seen[-1][1] == seen[-1][2] >= 1, seen  # every bucket in place at the end
    assert seen[-1][0] > seen[1][0], seen  # relaid after the rebuild: a newer layout
    assert seen[-1] == seen[-2], seen  # and it stays: no layout change every step
    assert all(outs[0]["at_layout"])  # the optimizer's gradients are the layout


def test_autotuned_gradient_allreduce_equals_single_process(runs2):
    # BAGUA_AUTOTUNE: the tuner switched the bucket layout while training (every rank at the
    # same iterations) and the run is still DDP's: ranks equal, single-process reference.
    outs = runs2["gar_autotune"]
    tuning, skipped, switches, bucket_bytes = outs[0]["autotune"]
    assert not skipped
    assert len(switches) >= 1, "the tuner never switched layouts: {}".format(outs[0]["autotune"])
    assert outs[0]["autotune"] == outs[1]["autotune"]
    assert outs[0]["layout"] == outs[1]["layout"]
    assert sorted(n for b in outs[0]["layout"] for n in b) == sorted(
        ["fc1.weight", "fc2.weight", "fc2.bias", "fc3.weight"])
    _assert_ranks_equal(outs)
    assert torch.allclose(outs[0]["final"], outs[0]["reference"], rtol=1e-5, atol=1e-6)


def test_no_sync_accumulation_equals_single_process(runs2):
    # 2 micro-batches per step, the first under no_sync: the sum reduces once per step.
    outs = runs2["no_sync"]
    _assert_ranks_equal(outs)
    # Reference: the gradient of the two micro-batch losses summed, averaged over 2 ranks.
    import worker_base
    model = worker_base.Net()
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(outs[0]["init"].clone(), model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(6):
        opt.zero_grad()
        for r in range(2):
            for micro in range(2):
                x, y = worker_base.data(r * 2 + micro, step)
                (torch.nn.functional.mse_loss(model(x), y) / 2).backward()
        opt.step()
    assert torch.allclose(outs[0]["final"], worker_base.flat(model), rtol=1e-5, atol=1e-6)


def test_bytegrad_ranks_bitwise_equal_and_close(runs2):
    outs = runs2["bytegrad"]
    _assert_ranks_equal(outs)
    # 8-bit quantised gradients: close to the exact run, not equal.
    assert torch.allclose(outs[0]["final"], outs[0]["reference"], atol=2e-3)


@pytest.mark.parametrize("which", ["builtin", "user_written"])
def test_decentralized_all_matches_simulation(runs2, which):
    # The built-in algorithm (C++ reducer) and a user-written one in the shape of Bagua's own
    # Python implementation (Python engine, lr 0.05 both).
    outs = runs2["decentralized"] if which == "builtin" else \
        [o["user_decentralized"] for o in runs2["dropin"]]
    # x_{t+1} = avg(x_t) - lr * g_r(x_t): simulate both ranks.
    import worker_base
    models = []
    for r in range(2):
        m = worker_base.Net()
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(outs[0]["init"].clone(), m.parameters())
        models.append(m)
    for step in range(8):
        grads = []
        for r, m in enumerate(models):
            m.zero_grad()
            x, y = worker_base.data(r, step)
            torch.nn.functional.mse_loss(m(x), y).backward()
            grads.append(torch.cat([p.grad.reshape(-1) for p in m.parameters()]))
        avg = (worker_base.flat(models[0]) + worker_base.flat(models[1])) / 2
        for r, m in enumerate(models):
            with torch.no_grad():
                torch.nn.utils.vector_to_parameters(avg - 0.05 * grads[r], m.parameters())
    for r in range(2):
        assert torch.allclose(outs[r]["final"], worker_base.flat(models[r]), rtol=1e-5, atol=1e-6)
    if which == "builtin":
        # bagua_buckets[0]._peer_weight: the last average, parameters in reverse order (Bagua's
        # single decentralized bucket); the same on both ranks.
        n, pw = outs[0]["peer_weight"]
        last = torch.cat([t.reshape(-1) for t in reversed(
            [p.detach() for p in _unflat(avg, worker_base.Net())])])
        assert n == 1 and torch.allclose(pw, last, rtol=1e-5, atol=1e-6)
        assert torch.equal(outs[1]["peer_weight"][1], pw)


def _unflat(vec, model):
    torch.nn.utils.vector_to_parameters(vec.clone(), model.parameters())
    return list(model.parameters())


def test_low_precision_decentralized_replica_invariant():
    outs = harness.run("bundle", 3, {"items": {"lp": {"func": "train", "args": {
        "algorithm": "low_precision_decentralized", "steps": 6,
        "kwargs": {"hierarchical": False}}}, "comm": {"func": "comm_basic"},
        "comm_bagua": {"func": "comm_bagua"}}})
    comm_checks.check_collectives([o["comm"] for o in outs], 3)
    comm_checks.check_bagua_api([o["comm_bagua"] for o in outs], 3)
    outs = [o["lp"] for o in outs]
    n = 3
    for r in range(n):
        me = outs[r]["replicas"]["self"]
        left = outs[(r - 1) % n]["replicas"]["right"]
        right = outs[(r + 1) % n]["replicas"]["left"]
        assert torch.equal(me, left) and torch.equal(me, right)
        assert all(torch.isfinite(torch.tensor(outs[r]["losses"])))
        nb, wn, rn = outs[r]["lp_bucket"]  # Bagua's bucket view: one bucket, the replica
        assert nb == 1 and wn == rn


def test_qadam_warmup_equals_adam(runs2):
    # While step < warmup_steps QAdam is Adam on the averaged gradient: 2 ranks == torch Adam
    # on the concatenated batch.
    outs = runs2["qadam_warmup"]
    _assert_ranks_equal(outs)
    import worker_base
    model = worker_base.Net()
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(outs[0]["init"].clone(), model.parameters())
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(8):
        opt.zero_grad()
        xs, ys = zip(*[worker_base.data(r, step) for r in range(2)])
        torch.nn.functional.mse_loss(model(torch.cat(xs)), torch.cat(ys)).backward()
        opt.step()
    assert torch.allclose(outs[0]["final"], worker_base.flat(model), rtol=1e-5, atol=1e-6)


def test_qadam_compression_stage_runs(runs2):
    outs = runs2["qadam_compressed"]
    _assert_ranks_equal(outs)
    assert torch.isfinite(outs[0]["final"]).all()


def _train_loss(weights, steps):
    """MSE of the test model with `weights` over every batch both ranks trained on."""
    import worker_base
    model = worker_base.Net()
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(weights.clone(), model.parameters())
        xs, ys = zip(*[worker_base.data(r, s) for r in range(2) for s in range(steps)])
        return torch.nn.functional.mse_loss(model(torch.cat(xs)), torch.cat(ys)).item()


def test_qadam_default_eps_trains(runs2):
    # 16 steps, warm-up 4, default eps: the elements whose gradient was exactly zero through the
    # warm-up (v = 0) are held, so the loss over the training batches falls and every rank ends
    # bitwise equal. Without the hold (Bagua's exact update) the same run's loss rises: the
    # option is what fixes it.
    outs = runs2["qadam_default_eps"]
    _assert_ranks_equal(outs)
    assert torch.isfinite(outs[0]["final"]).all()
    assert all(l == l for o in outs for l in o["losses"])
    before = _train_loss(outs[0]["init"], 16)
    after = _train_loss(outs[0]["final"], 16)
    assert after < before, "loss {} -> {}".format(before, after)
    off = runs2["qadam_default_eps_nohold"]
    assert torch.equal(off[0]["init"], outs[0]["init"])
    off_after = _train_loss(off[0]["final"], 16)
    assert not off_after < before, "Bagua's update did not diverge: {} -> {}".format(
        before, off_after)


def test_async_model_average_runs_and_aborts(runs2):
    outs = runs2["async"]
    for o in outs:
        assert torch.isfinite(o["final"]).all()
        assert o["rounds"] >= 1


def test_find_unused_parameters(runs2):
    a, b = runs2["features"]
    assert a["unused_unchanged"] and b["unused_unchanged"]
    assert torch.equal(a["unused_final"], b["unused_final"])
    for o in (a, b):
        assert "did not receive a gradient" in o["unused_error"] and "unused.weight" in o["unused_error"]


def test_params_to_ignore(runs2):
    a, b = runs2["features2"]
    assert not torch.equal(a["ignored_fc1"], b["ignored_fc1"])  # own init, own gradients
    assert torch.equal(a["ignored_rest"], b["ignored_rest"])


def test_algorithm_switch(runs2):
    a, b = runs2["features2"]
    assert torch.isfinite(a["switch_final"]).all()
    assert torch.equal(a["switch_final"], b["switch_final"])
    # Bagua's order with a new DDP per algorithm: every wrapper but the last closed by the next
    # wrap; the last one (low-precision decentralized) leaves the ranks' weights close.
    for o in (a, b):
        assert o["switch_ddp_closed"] == [True] * 5 + [False]
        assert torch.isfinite(o["switch_ddp_final"]).all()
    assert torch.allclose(a["switch_ddp_final"], b["switch_ddp_final"], atol=0.05)


def _dropin_reference(init, steps=6, lr=0.05):
    import worker_base

    return worker_base.reference(init, 2, steps, lr, "gradient_allreduce")


@pytest.mark.parametrize("key", ["user_algo", "user_algo_pyop"])
def test_user_written_algorithm_trains_like_allreduce(runs2, key):
    # An AlgorithmImpl written as in Bagua's tutorial runs on the Python engine and, doing a
    # mean all-reduce of the gradients, equals single-process training on the joint batch.
    outs = [o[key] for o in runs2["dropin"]]
    assert torch.equal(outs[0]["init"], outs[1]["init"])
    _assert_ranks_equal(outs)
    assert torch.allclose(outs[0]["final"], _dropin_reference(outs[0]["init"]), rtol=1e-5,
                          atol=1e-6)
    assert outs[0]["impl"] == "TutorialGradientAllReduceImpl"
    assert outs[0]["steps"] == 6 and outs[0]["buckets"] >= 1
    if key == "user_algo_pyop":
        assert outs[0]["ops_run"] == 6 * outs[0]["buckets"]


@pytest.mark.parametrize("key", ["fuse_after_wrap_flat", "fuse_after_wrap_noflat"])
def test_fuse_optimizer_after_with_bagua(runs2, key):
    # Bagua's order (with_bagua, then fuse_optimizer, which re-lays the parameters out), then
    # p.data replaced by hand: the reducer rebinds each time and training equals the reference.
    outs = [o[key] for o in runs2["dropin"]]
    assert outs[0]["moved"]
    _assert_ranks_equal(outs)
    assert torch.allclose(outs[0]["final"], _dropin_reference(outs[0]["init"]), rtol=1e-5,
                          atol=1e-6)
    assert outs[0]["fused_count"] == 3  # fuse_optimizer's layout kept: one group per step
    # do_flatten: the wrap made the gradients one buffer in bucket (reversed) order.
    assert outs[0]["grads_adjacent"] == (key == "fuse_after_wrap_flat")


def test_parameter_reshaped_after_wrap_is_named(runs2):
    for o in runs2["dropin"]:
        assert "fc1.weight" in o["reshape_error"] and "shape" in o["reshape_error"]


def test_wrapper_names(runs2):
    outs = [o["names"] for o in runs2["dropin"]]
    for o in outs:
        assert o["module_name"].startswith("DistributedDataParallel_V1_9_0_")
        assert o["inner"] == "BaguaDistributedDataParallel" and o["unwrap"] == "Net"
        assert o["ignore"] == ["fc3.weight"]
        # find_unused_parameters: before any backward every trainable, non-ignored parameter.
        assert o["build"] == ["fc1.weight", "fc2.weight", "fc2.bias"]
        assert sorted(n for b in o["buckets"] for n in b) == sorted(o["build"])
    # require_backward_grad_sync=False: local gradients differ; True: averaged, equal.
    assert not torch.equal(outs[0]["local_grad"], outs[1]["local_grad"])
    assert torch.equal(outs[0]["synced_grad"], outs[1]["synced_grad"])
    assert torch.allclose(outs[0]["synced_grad"],
                          (outs[0]["local_grad"] + outs[1]["local_grad"]) / 2, atol=1e-7)


def test_sync_batchnorm_equals_batchnorm_on_joint_batch(runs2):
    outs = runs2["syncbn"]
    ref = outs[0]["ref"]
    b = outs[0]["y"].shape[0]
    for r, o in enumerate(outs):
        assert o["type"] == "SyncBatchNorm" and o["batches"] == 2
        assert torch.allclose(o["y"], ref["y"][r * b:(r + 1) * b], rtol=1e-5, atol=1e-5)
        assert torch.allclose(o["rm"], ref["rm"], rtol=1e-5, atol=1e-6)
        assert torch.allclose(o["rv"], ref["rv"], rtol=1e-5, atol=1e-5)
        assert torch.allclose(o["gx"], ref["gx"][r * b:(r + 1) * b], rtol=1e-4, atol=1e-5)
        # eval mode: the (synchronised) running statistics, no communication
        assert torch.isfinite(o["eval"]).all()
    # weight and bias gradients stay local: their sum over ranks is the joint batch's
    assert torch.allclose(sum(o["gw"] for o in outs), ref["gw"], rtol=1e-4, atol=1e-5)
    assert torch.allclose(sum(o["gb"] for o in outs), ref["gb"], rtol=1e-4, atol=1e-5)


def test_init_process_group_with_a_store():
    outs = harness.run("store_init", 2)
    for r, o in enumerate(outs):
        assert o["sum"] == 3.0 and o["dist_sum"] == 1.0 and o["rank"] == r
        assert o["env"] == (str(r), "2", str(r))
        assert "twice" in o["second_init"]


def test_wrap_broadcasts_model_and_optimizer_state(runs2):
    # Our equivalent of Bagua's test_broadcast_state (torch_api/ and data_parallel/; their own
    # code calls inspect.getargspec): after rank-local training, with_bagua and the DDP wrapper
    # leave every rank with rank 0's weights and optimizer state (tensors and scalars), for
    # Bagua's optimizers SGD, Adam, Rprop x its two hyper-parameter sets.
    outs = runs2["broadcast_state"]
    assert len(outs[0]) == 12
    for case in outs[0]:
        a, b = outs[0][case], outs[1][case]
        assert not torch.equal(a["before"], b["before"]), case  # the ranks differed
        assert [n for n, _ in a["model"]] == [n for n, _ in b["model"]]
        assert all(torch.equal(x, y) for (_, x), (_, y) in zip(a["model"], b["model"])), case
        # rank 0's own weights, everywhere
        assert torch.equal(a["after"], a["before"]) and torch.equal(b["after"], a["before"])
        plain_sgd = case.endswith("SGD_1")  # no momentum: no per-parameter tensors
        assert len(a["optim"]) == len(b["optim"]) and (plain_sgd or a["optim"]), case
        for (p1, n1, v1), (p2, n2, v2) in zip(a["optim"], b["optim"]):
            assert (p1, n1) == (p2, n2)
            assert torch.equal(v1, v2) if torch.is_tensor(v1) else v1 == v2, (case, n1)


def test_buffers_broadcast_as_bagua_or_torch_ddp(runs2):
    outs = runs2["dropin"]
    for r, o in enumerate(outs):
        assert torch.equal(o["buffers_with_bagua"], torch.full((3,), float(r)))  # never
        assert torch.equal(o["buffers_ddp"], torch.zeros(3))  # rank 0's, before the forward
        # after .double() (new buffer tensors): rank 0's again, in float64
        assert torch.equal(o["buffers_ddp_double"], torch.full((3,), 10.0, dtype=torch.float64))


def test_qadam_from_parameter_groups_is_the_same_run(runs2):
    a, b = runs2["qadam_compressed"], runs2["qadam_compressed_groups"]
    for r in range(2):
        assert torch.equal(a[r]["final"], b[r]["final"])


def test_dtype_changed_after_wrap(runs2):
    # .double() after with_bagua: the reducer rebinds to the float64 memory; training equals
    # the single-process float64 reference on the joint batch.
    import worker_base

    outs = [o["double_after_wrap"] for o in runs2["dropin"]]
    assert outs[0]["dtype"] == "torch.float64"
    _assert_ranks_equal(outs)
    m = worker_base.Net().double()
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(outs[0]["init"].double(), m.parameters())
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    for step in range(3):
        xs, ys = zip(*[worker_base.data(r, step) for r in range(2)])
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(torch.cat(xs).double()), torch.cat(ys).double()).backward()
        opt.step()
    assert torch.allclose(outs[0]["final"], worker_base.flat(m), rtol=1e-9, atol=1e-12)


def test_a_model_freed_at_different_moments_on_each_rank_does_not_hold_the_others():
    # The host backend's side of test_gpu's case of that name (where NCCL's teardown used to
    # wait for the peers): rank 0 keeps each old model while rank 1 frees its copy and both
    # train a new one.
    outs = harness.run("drop_unevenly", 2, {"algorithms": ["decentralized", "bytegrad"]},
                       timeout=120)
    for o in outs:
        assert len(o["losses"]) == 2 and all(len(l) == 3 for l in o["losses"])
        assert all(s < 20 for s in o["seconds"]), o["seconds"]


def test_dropping_a_wrapped_model_frees_it_at_once():
    # Module, optimizer and wrapper are gone as soon as the last reference goes, with Python's
    # garbage collector off: no reference cycle holds the wrap (its reducer, process groups and
    # buffers) until a collection that comes at a different moment on every rank. Also a torch
    # LR scheduler made after the wrap (as in Bagua's examples) works: it re-wraps opt.step,
    # which needs a bound-method shape (it failed with AttributeError '__self__' before).
    outs = harness.run("freed_by_refcount", 2, {}, timeout=120)
    for o in outs:
        assert set(o) == {"with_bagua", "ddp_wrapper", "decentralized", "qadam",
                          "user_algorithm"}
        for kind, v in o.items():
            assert v["alive"] == [False, False, False], (kind, v["alive"], v["held_by"])
            assert v["lr"] == pytest.approx((0.01 if kind == "qadam" else 0.05) * 0.5 ** 3), kind
