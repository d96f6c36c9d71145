"""What both engines (``_native_engine.py``, ``_python_engine.py``) share: the engine base, the
device check and the broadcast of rank 0's optimizer state at the wrap."""

import torch

from .. import communication as comm


def _broadcast_optimizer_state(optimizers, group):
    """Every rank takes rank 0's optimizer state (tensors directly, other values pickled)."""
    from ..algorithms.q_adam import QAdamOptimizer

    for opt in optimizers:
        if isinstance(opt, QAdamOptimizer):
            continue  # its state lives in the core; the reducer broadcasts it
        state = getattr(opt, "state", {})
        scalars = {}
        for gi, g in enumerate(opt.param_groups):
            for pi, p in enumerate(g["params"]):
                st = state.get(p, {})
                for k in sorted(st):
                    v = st[k]
                    if isinstance(v, torch.Tensor):
                        if v.is_contiguous() and not v.is_cuda:
                            comm.broadcast(v, 0, group)
                        else:
                            tmp = v.detach().contiguous()
                            comm.broadcast(tmp, 0, group)
                            v.copy_(tmp)
                    else:
                        scalars[(gi, pi, k)] = v
        if scalars:
            got = comm.broadcast_object(scalars, 0, group)
            for (gi, pi, k), v in got.items():
                p = opt.param_groups[gi]["params"][pi]
                state.setdefault(p, {})[k] = v



def _check_devices(named_params, stream):
    """CUDA parameters must live on the device of the group's NCCL communicator (its stream's):
    NCCL would read another device's memory (an illegal memory access that kills the process).
    Both engines call it before their first collective (and the native one at every rebuild)."""
    want = getattr(stream, "device", None)
    if want is None:
        return
    for n, p in named_params:
        if p.is_cuda and p.device != want:
            raise RuntimeError(
                "bagua: parameter {!r} is on {} but the process group communicates on {} (the "
                "device selected at init_process_group: the script's torch.cuda.set_device() "
                "before it, else LOCAL_RANK's); move the model there (model.to({!r})) or call "
                "torch.cuda.set_device() before bagua.init_process_group()".format(
                    n, p.device, want, str(want)))



class _Engine:
    """What both engines share: their wrapper, held weakly (it owns them)."""

    @property
    def ddp(self):
        d = self._ddp()
        if d is None:
            raise RuntimeError("bagua: the wrapper of this engine was freed")
        return d

    def native_reducer(self):
        """The _bagua_ext.Reducer the C++ gradient hooks feed, or None (Python hooks)."""
        return None

    def attach_optimizers(self):
        pass

    def steps(self):
        """The wrap's StepInBackward (step_in_backward.py), or None."""
        return None

