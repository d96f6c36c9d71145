"""Bagua's generic fused optimizer for any torch optimizer (contrib.fuse_optimizer).

``fuse_optimizer(opt)`` flattens each param group's parameters (and gradients) of one
(dtype, device) into one contiguous storage; ``opt.fuse_step()`` then steps every run of
byte-adjacent parameters as ONE tensor (one kernel per operation instead of one per
parameter) by running the optimizer's own ``step`` on a fused view, with the optimizer state
laid out the same way (per-parameter states become views into the fused state, so ``step()``
and ``fuse_step()`` can alternate freely and give bitwise the same result for element-wise
optimizers). Runs that cannot be fused (gradients missing, state keys or scalar states that
differ) are stepped per parameter. Consecutive ``fuse_step()`` calls keep the fusion while the
layout holds (the same parameters, weight and gradient addresses and state keys): the fused views
and their state stay in place and a step is the optimizer's own step on them, with no Python
work per parameter; the optimizer's ``step``, ``state_dict``, ``load_state_dict`` and
``add_param_group`` first put the per-parameter state back (scalar states such as Adam's
``step`` are copied out of the fused state then).

Which runs fuse (Bagua's counts, ``tests/contrib/test_fused_optimizer.py``, on torch 1.x and 2):
the weights must be adjacent in the group's order, and the gradients either adjacent too or
each in memory of its own (fresh from autograd after ``zero_grad(set_to_none=True)``: they are
copied into the fused gradient). Gradients that share memory in another order were laid out by
someone else, e.g. ``with_bagua(do_flatten=True)``'s buckets: such a run is not fused (Bagua:
"both are flattened, should not fuse"), it is stepped per parameter. ``do_flatten=True`` also
remembers each gradient's place (``_bagua_grad_view``) so that a ``with_bagua`` wrap re-points
fresh gradients there, as it does with its own layout.

This is pure torch on purpose: the C++ optimizer/ library owns its parameter memory and keeps
its own state per rule, while Bagua's API fuses *the user's* torch optimizer and its state.
"""

import types
import warnings

import torch

from ...utils import _lay_out_grads, _lay_out_weights, _partitions


def is_fused_optimizer(optimizer):
    return bool(getattr(optimizer, "_bagua_fused", False))


def _adjacent(tensors):
    for a, b in zip(tensors, tensors[1:]):
        if b.data_ptr() != a.data_ptr() + a.numel() * a.element_size():
            return False
    return all(t.is_contiguous() for t in tensors)


def _storage_ptr(t):
    return (t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()).data_ptr()


def _laid_out_elsewhere(grads):
    """Gradients that share memory but are not back to back in this order."""
    if _adjacent(grads):
        return False
    ptrs = [_storage_ptr(g) for g in grads]
    return len(set(ptrs)) < len(ptrs)


def _span(tensors):
    """One 1-D tensor over byte-adjacent tensors (aliasing), or a concatenated copy."""
    total = sum(t.numel() for t in tensors)
    if _adjacent(tensors):
        return tensors[0].detach().as_strided((total,), (1,)), True
    return torch.cat([t.detach().reshape(-1) for t in tensors]), False


def _runs(tensors):
    """Runs (>= 2) of positions whose tensors lie back to back in memory, each in address
    order."""
    order = sorted(range(len(tensors)), key=lambda i: tensors[i].data_ptr())
    runs, cur = [], []
    for i in order:
        t = tensors[i]
        if cur:
            prev = tensors[cur[-1]]
            if (t.is_contiguous() and prev.is_contiguous() and t.dtype == prev.dtype and
                    t.device == prev.device and
                    t.data_ptr() == prev.data_ptr() + prev.numel() * prev.element_size()):
                cur.append(i)
                continue
            if len(cur) >= 2:
                runs.append(cur)
        cur = [i]
    if len(cur) >= 2:
        runs.append(cur)
    return runs


def calculate_mutual_groups(tensors_list):
    """Groups of positions that are contiguous in memory in every list of ``tensors_list``
    (e.g. parameters, gradients and a state, position by position): each group lists the
    positions in address order; a group counts only if every list has exactly that run
    (Bagua's helper for fusing without flattening)."""
    if not tensors_list:
        return []
    first = _runs(tensors_list[0])
    others = [set(tuple(r) for r in _runs(ts)) for ts in tensors_list[1:]]
    return [r for r in first if all(tuple(r) in o for o in others)]


def fuse_optimizer(optimizer, do_flatten=True, check_flatten=True):
    """Makes ``optimizer`` fusable and returns it (Bagua's API). Raises if already fused."""
    if is_fused_optimizer(optimizer):
        raise RuntimeError("bagua: this optimizer is already fused")
    optimizer._bagua_fused = True
    optimizer._bagua_fused_count = 0
    optimizer._bagua_check_flatten = check_flatten
    optimizer.fuse_step = types.MethodType(fuse_step, optimizer)
    if do_flatten:
        for group in optimizer.param_groups:
            _lay_out_weights(group["params"])
            _lay_out_grads(group["params"])
    return optimizer


def _same(a, b):
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return False
    return a == b


def _fusable(params, state):
    """(per-element keys, scalar values) when ``params`` can be stepped as one, else None."""
    keys = None
    for p in params:
        k = tuple(sorted(state.get(p, {}).keys()))
        if keys is None:
            keys = k
        elif k != keys:
            return None
    elem, scalars = [], {}
    for k in keys:
        vals = [state[p][k] for p in params]
        if all(isinstance(v, torch.Tensor) and v.shape == p.shape for v, p in zip(vals, params)):
            elem.append(k)
        elif all(_same(v, vals[0]) for v in vals):
            scalars[k] = vals[0]
        else:
            return None
    return elem, scalars


def fuse_step(optimizer, closure=None):
    """One optimizer step with byte-adjacent parameters updated as one tensor.

    On a ``with_bagua`` model whose gradient all-reduce stepped this optimizer's buckets inside
    the backward pass (``BAGUA_OPTIM_STEP_IN_BACKWARD``, see data_parallel/step_in_backward.py),
    the call completes that step: the parameters no bucket holds are stepped, and the groups that
    fused during the backward pass count as this call's."""
    if not is_fused_optimizer(optimizer):
        raise RuntimeError("bagua: call fuse_optimizer(optimizer) before fuse_step")
    ctl = getattr(optimizer, "_bagua_step_ctl", None)
    ctl = ctl() if ctl is not None else None
    if ctl is not None and ctl.static_reason is not None:
        ctl = None  # this wrap never steps inside backward: a step after it, as without a wrap
    resync = getattr(optimizer, "_bagua_resync_state", None)
    if ctl is not None or resync is not None:
        # Stepping inside backward, or QAdam (whose state the core reads): per-parameter
        # state, planned every step; the buckets stepped inside backward keep their plans.
        _retire_plan(optimizer, buckets=False)
        if ctl is not None and ctl.finish_if_stepped(optimizer, (closure,) if closure else (),
                                                     {}, fused=True):
            return None
        _retire_plan(optimizer)
        step = (lambda: optimizer.step(closure)) if closure is not None else optimizer.step
        loss, fused = _fuse_and_step(optimizer, step)
    else:
        loss, fused = _planned_fuse_step(optimizer, closure)
    optimizer._bagua_fused_count += len(fused)
    if resync is not None:  # QAdam: its m and v live in the core, which the algorithm reads
        resync()
    return loss


def _layout_key(optimizer, subsets=None):
    """What a kept fusion plan depends on: per group (``subsets``: per group, the parameters
    the plan steps; None for all), each parameter's identity, the addresses of its weight and
    gradient (None without one) and its state's keys."""
    key = []
    state = optimizer.state
    for gi, group in enumerate(optimizer.param_groups):
        key.append(gi)
        for p in group["params"] if subsets is None else subsets[gi]:
            g = p.grad
            st = state.get(p)
            key.append((id(p), p.data_ptr(), g.data_ptr() if g is not None else None,
                        tuple(st.keys()) if st else ()))
    return tuple(key)


class _Plan:
    """A fusion kept from one fuse_step to the next while the layout holds (_layout_key): the
    fused views and their state stay in place and the per-parameter element states are views
    into it, so a step is the optimizer's own step on the fused list and nothing more. Kept only
    where every fused weight and gradient is a view of the parameters' own memory (a gradient
    copied into the fusion would be stale at the next step). Scalar states (Adam's ``step``)
    advance in the fused state only; ``retire()`` copies them back to every parameter and drops
    the fused entries, before anything else reads or steps the per-parameter state (the
    optimizer's ``step``, ``state_dict``, ``load_state_dict``, ``add_param_group``) or the layout
    changes."""

    def __init__(self, key, fusion):
        self.key = key
        self.fusion = fusion

    def retire(self, state):
        _unfuse_state(state, self.fusion, keep=False)


def _retire_plan(optimizer, buckets=True):
    """Retires the whole-step plan (key None of ``_bagua_fuse_plans``) and (``buckets``) the
    plans of the buckets stepped inside the backward pass (keyed by bucket index)."""
    plans = optimizer.__dict__.get("_bagua_fuse_plans")
    if not plans:
        return
    for key in list(plans) if buckets else [None]:
        plan = plans.pop(key, None)
        if plan is not None:
            plan.retire(optimizer.state)


def _guard(optimizer):
    """Wraps (once) the optimizer's methods that read or replace the per-parameter state so
    that a kept plan is retired first; the unwrapped ``step`` is kept for the plan's steps."""
    if "_bagua_unguarded_step" in optimizer.__dict__:
        return
    optimizer._bagua_unguarded_step = optimizer.step
    for name in ("step", "state_dict", "load_state_dict", "add_param_group"):
        raw = getattr(optimizer, name)

        def guarded(*args, _raw=raw, **kwargs):
            _retire_plan(optimizer)
            return _raw(*args, **kwargs)

        guarded._bagua_guard = True
        setattr(optimizer, name, guarded)


def _with_groups(fusion, step):
    """Runs ``step()`` with every group's parameter list replaced by the fusion's, then puts the
    groups' own lists back."""
    for group, _, fused_params in fusion.groups:
        group["params"] = fused_params
    try:
        return step()
    finally:
        for group, params, _ in fusion.groups:
            group["params"] = params


def _planned_fuse_step(optimizer, closure):
    """A whole fused step (every group), reusing the kept plan while the layout holds: the same
    result as _fuse_and_step's (element-wise optimizers: bitwise), without re-deriving the
    fusion and moving the state in and out every step."""
    raw = optimizer.__dict__.get("_bagua_unguarded_step", optimizer.step)
    return _planned_step(optimizer, (lambda: raw(closure)) if closure else raw)


def _planned_bucket_step(optimizer, step, subsets, bucket):
    """One bucket's parameters (``subsets``, per group) stepped inside the backward pass
    (data_parallel/step_in_backward.py) through that bucket's kept plan: no fusion derived, no
    state moved and no scalar state compared (a device synchronisation for a torch fused
    optimizer's ``step`` tensors) while the backward pass runs. The buckets hold disjoint
    parameters, so their plans coexist; every guarded method retires them all."""
    if getattr(step, "_bagua_guard", False):
        step = optimizer.__dict__.get("_bagua_unguarded_step", step)
    return _planned_step(optimizer, step, subsets, bucket)


def _planned_step(optimizer, step, subsets=None, key=None):
    """_fuse_and_step(optimizer, step, subsets), keeping the fusion in
    ``optimizer._bagua_fuse_plans[key]`` (None: the whole step; a bucket's index) while its
    layout holds. Returns (the step's result, the indices of the groups with a fused run)."""
    plans = optimizer.__dict__.setdefault("_bagua_fuse_plans", {})
    plan = plans.get(key)
    if plan is not None and plan.key != _layout_key(optimizer, subsets):
        plans.pop(key).retire(optimizer.state)
        plan = None
    if plan is not None:
        return _with_groups(plan.fusion, step), plan.fusion.fused_groups
    fusion = _fuse(optimizer, subsets)
    keep = bool(fusion.runs) and fusion.aliased
    try:
        loss = _with_groups(fusion, step)
    finally:
        with torch.no_grad():
            _unfuse_state(optimizer.state, fusion, keep=keep)
    if keep:
        _guard(optimizer)
        # The state's keys as they are after this step (a first step creates them).
        plans[key] = _Plan(_layout_key(optimizer, subsets), fusion)
    return loss, fusion.fused_groups


class _Fusion:
    """What _fuse made: per group (group, its own parameters, the list with fused views), the
    fused runs (fused view, its parameters, the state keys laid out per element), the indices of
    the groups with a fused run, and whether every fused weight and gradient aliases the
    parameters' memory."""

    def __init__(self):
        self.groups = []
        self.runs = []
        self.fused_groups = set()
        self.aliased = True


def _fuse(optimizer, subsets=None):
    """Every run of byte-adjacent parameters (per group; ``subsets``: the parameters to step per
    group, None for all) as one fused view, its gradient and state laid out alike in
    ``optimizer.state``; the groups' parameter lists are left as they are (_with_groups swaps
    them in)."""
    state = optimizer.state
    fusion = _Fusion()
    with torch.no_grad():
        for gi, group in enumerate(optimizer.param_groups):
            params = group["params"]
            todo = params if subsets is None else subsets[gi]
            new_params = []
            for part in _partitions([p for p in todo if p.grad is not None]):
                info = _fusable(part, state) if len(part) >= 2 else None
                if info is None or not _adjacent([p.data for p in part]):
                    if len(part) >= 2 and optimizer._bagua_check_flatten and info is not None:
                        warnings.warn("bagua fuse_step: parameters are no longer contiguous "
                                      "(were they re-allocated?); stepping them one by one")
                    new_params.extend(part)
                    continue
                if _laid_out_elsewhere([p.grad for p in part]):
                    new_params.extend(part)
                    continue
                elem, scalars = info
                fp, _ = _span([p.data for p in part])
                fg, grad_aliased = _span([p.grad for p in part])
                fusion.aliased = fusion.aliased and grad_aliased
                fp.grad = fg
                st = dict(scalars)
                for k in elem:
                    st[k], _ = _span([state[p][k] for p in part])
                for k, v in scalars.items():
                    if isinstance(v, torch.Tensor):
                        st[k] = v.clone()
                state[fp] = st
                new_params.append(fp)
                fusion.runs.append((fp, part, elem))
                fusion.fused_groups.add(gi)
            new_params.extend(p for p in todo if p.grad is None)
            fusion.groups.append((group, params, new_params))
    return fusion


def _unfuse_state(state, fusion, keep):
    """Each parameter's state back from its fused run's: element states as views into the fused
    state, scalars copied. ``keep``: the fused entries stay (a kept plan), else they are
    dropped."""
    for fp, part, elem in fusion.runs:
        st = state[fp] if keep else state.pop(fp)
        off = 0
        for p in part:
            n = p.numel()
            ps = state.setdefault(p, {})
            for k, v in st.items():
                if k in elem or (isinstance(v, torch.Tensor) and v.shape == fp.shape):
                    ps[k] = v[off:off + n].view_as(p)
                elif isinstance(v, torch.Tensor):
                    ps[k] = v.clone()
                else:
                    ps[k] = v
            off += n


def _fuse_and_step(optimizer, step, subsets=None):
    """Runs ``step()`` (the optimizer's step, no argument) once with every run of byte-adjacent
    parameters replaced by one fused view (the optimizer's state laid out alike), then puts the
    parameters and their states back. ``subsets``: per param group, the parameters to step (the
    others are left out of this call); None steps every group's own. Returns (the step's result,
    the indices of the groups in which at least one run was fused)."""
    fusion = _fuse(optimizer, subsets)
    try:
        loss = _with_groups(fusion, step)
    finally:
        with torch.no_grad():
            _unfuse_state(optimizer.state, fusion, keep=False)
    return loss, fusion.fused_groups
