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
                assert o["subgroup"].item() == 4.0 and o["subgroup_member"]
            else:  # outside the group: the collective returned at once, value untouched
                assert o["subgroup"].item() == float(r + 1) and not o["subgroup_member"]


def check_bagua_api(outs, n):
    """comm_bagua's results (workers.py) against their closed forms."""
    root = n - 1
    odd = [k for k in range(n) if k % 2 == 1]
    for r, o in enumerate(outs):
        assert (o["comm_rank"], o["comm_nranks"]) == (r, n)
        assert o["dist"] == (True, r, n)
        assert o["dist_allreduce"] == sum(range(1, n + 1))
        per = (10 + n - 1) // n
        assert o["sampler"] == [(r + n * i) % 10 for i in range(per)]
        gathered = torch.cat([torch.arange(3, dtype=torch.float32) + 10 * k for k in range(n)])
        if r == root:
            assert torch.equal(o["gather"], gathered)
            assert torch.equal(o["gather_inplace"], gathered)
        assert torch.equal(o["scatter"], torch.arange(2 * r, 2 * r + 2, dtype=torch.float32) * 7)
        assert torch.equal(o["scatter_inplace"],
                           torch.arange(2 * r, 2 * r + 2, dtype=torch.float32) * 7)
        assert torch.equal(o["alltoall_v"], torch.cat(
            [torch.full((r + 1,), float(100 * i + r)) for i in range(n)]))
        tot = float(sum(range(1, n + 1)))
        assert torch.equal(o["coalesced"][0], torch.full((3,), tot))
        assert torch.equal(o["coalesced"][1], torch.full((2,), int(tot), dtype=torch.int64))
        assert torch.equal(o["coalesced"][2], torch.full((4,), float(sum(range(n)))))
        assert torch.equal(o["broadcast_coalesced"][0], torch.full((2,), float(root)))
        assert torch.equal(o["broadcast_coalesced"][1], torch.full((3,), root, dtype=torch.int32))
        xs = [torch.tensor([1 << k, 0xFF ^ (1 << k), k + 1], dtype=torch.int64) for k in range(n)]
        exp = {"BOR": xs[0].clone(), "BAND": xs[0].clone(), "BXOR": xs[0].clone()}
        for k in range(1, n):
            exp["BOR"] |= xs[k]
            exp["BAND"] &= xs[k]
            exp["BXOR"] ^= xs[k]
        for op, e in exp.items():
            assert torch.equal(o["bitwise_" + op], e), op
        assert torch.equal(o["reduce_bor"], exp["BOR"] if r == 0 else xs[r])
        prod = 1.0
        for k in range(n):
            prod *= k + 2
        assert o["product"] == prod
        assert torch.equal(o["comm_avg"], torch.full((4,), sum(range(n)) / n))
        ranks, outside, crank, cn = o["from_torch"]
        assert ranks == odd and outside == (r not in odd)
        if r in odd:
            assert (crank, cn) == (odd.index(r), len(odd))
            assert o["from_torch_allreduce"] == float(sum(odd))
        else:
            assert o["from_torch_allreduce"] == float(r)
        assert o["patched"]
        assert o["hier"] == (r, n, float(sum(range(1, n + 1))), 0, 1, float(r + 1), True)
