"""Bagua's fused-optimizer cases with a with_bagua model (its tests/contrib/test_fused_optimizer.py
runs them only on CUDA): which runs fuse when fuse_optimizer and with_bagua both lay memory out,
on worlds 1 and 2, with torch 1's and torch 2's zero_grad."""

import pytest

import harness
import workers_dropin

EPOCHS = 11  # fuse_step on the even epochs: 6 steps x 2 groups fused when fusing


@pytest.mark.parametrize("world", [1, 2])
def test_fused_counts_with_bagua(world):
    # With the optimizer stepping inside the backward pass (off by default), for the gradient
    # algorithms: the same counts and the same weights.
    outs = harness.run("fuse_bagua", world, {"epochs": EPOCHS}, timeout=240,
                       env={"BAGUA_OPTIM_STEP_IN_BACKWARD": "1"})
    fused = 2 * ((EPOCHS + 1) // 2)
    # Bagua's expectations: optimizer flattened, module not: fuse (Bagua's 102 at 101 epochs);
    # both flattened, or only the module: do not fuse (0). Always the unfused run's weights.
    want = {(True, False): fused, (True, True): 0, (False, True): 0}
    bad = []
    for out in outs:
        assert len(out) == 2 * len(workers_dropin.FUSE_OPTIMIZERS) * 7
        for (none, k, algo, f1, f2), (equal, count) in sorted(out.items()):
            if not equal or count != want[(f1, f2)]:
                bad.append((workers_dropin.FUSE_OPTIMIZERS[k], algo, "set_to_none={}".format(none),
                            "fuse do_flatten={}".format(f1), "with_bagua do_flatten={}".format(f2),
                            "equal={}".format(equal), "count={} want {}".format(
                                count, want[(f1, f2)])))
    assert not bad, "\n".join(map(str, bad))
