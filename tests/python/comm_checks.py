"""Checks of the collectives worker's results (world 2 and 3 runs are in test_training.py,
sharing their launches): every element against its closed form."""

import torch


def check_collectives(outs, n):
    for r, o in enumerate(outs):
        assert o["rank"] == r and o["world"] == n
        assert o["local_rank"] == r and o["local_size"] == n
        base = torch.arange(1001, dtype=torch.float64)
        per_rank = [base * (k + 1) + k for k in range(n)]
        for dt in (torch.float32, torch.float64, torch.int32, torch.int64, torch.float16):
            vals = [v.to(dt).to(torch.float64) for v in per_rank]
            stack = torch.stack(vals)
            exp = {"SUM": stack.sum(0), "MAX": stack.max(0).values, "MIN": stack.min(0).values,
                   "AVG": stack.sum(0) / n}
            for op, e in exp.items():
                key = "allreduce_{}_{}".format(dt, op)
                if key not in o:
                    continue
                got = o[key].to(torch.float64)
                if dt == torch.float16:
                    assert torch.allclose(got, e.to(dt).to(torch.float64), rtol=2e-3, atol=1e-2), key
                else:
                    assert torch.equal(got, e.to(dt).to(torch.float64)), key
        assert torch.equal(o["broadcast"], torch.arange(7, dtype=torch.float32) + 100 * (n - 1))
        assert torch.equal(o["allgather"], torch.cat(
            [torch.arange(7, dtype=torch.float32) + 100 * k for k in range(n)]))
        full = sum(torch.arange(5 * n, dtype=torch.float32) * (k + 1) for k in range(n))
        assert torch.equal(o["reduce_scatter"], full[5 * r:5 * (r + 1)])
        if r == 0:
            assert torch.equal(o["reduce"], torch.full((9,), float(sum(range(1, n + 1)))))
        exp_a2a = torch.cat([torch.arange(3 * r, 3 * r + 3, dtype=torch.float32) + 1000 * k
                             for k in range(n)])
        assert torch.equal(o["alltoall"], exp_a2a)
        if r == 1:
            assert torch.equal(o["recv"], torch.arange(11, dtype=torch.float32) * 3)
        assert o["object"] == {"from": 0, "list": [1, 2, 0]}
        if n >= 3:
            if r in (0, 2):
                assert o["subgroup"].item() == 4.0
            else:
                assert o["subgroup"] is None
