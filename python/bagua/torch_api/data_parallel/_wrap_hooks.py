"""The autograd and optimizer hooks a wrap installs (bagua_distributed.py): gradient-ready hooks
(Python or the extension's C++ ``GradReadyHook``) and the patched ``optimizer.step``."""

import weakref

from .._ext import ext


def _raw_step(opt, func, held):
    """A no-argument callable running ``opt``'s own step (``func`` unbound, or ``held``),
    holding ``opt`` weakly."""
    if func is None:
        return held
    ref = weakref.ref(opt)
    return lambda: func(ref())


class _PatchedStep:
    """``optimizer.step`` after the wrap: the original step, then the algorithm's post-step
    hook. Shaped like a bound method (``__self__``, ``__func__``) because torch's LR schedulers
    re-wrap ``optimizer.step`` through them (a scheduler made after ``with_bagua``, as in
    Bagua's examples), but it holds the optimizer weakly: a bound method stored on the optimizer
    would be a cycle keeping the optimizer's state until the garbage collector runs."""

    def __init__(self, func, opt):
        self.__func__ = func
        self._opt = weakref.ref(opt)
        self.__name__ = self.__qualname__ = "step"
        self.__doc__ = func.__doc__

    @property
    def __self__(self):
        return self._opt()

    def __call__(self, *args, **kwargs):
        return self.__func__(self._opt(), *args, **kwargs)



def _grad_hook(p, fn):
    """Calls ``fn()`` once p's gradient is accumulated (returns (handle, keep-alive)). ``fn``
    must not hold ``p`` strongly: from torch 2.1 the hook lives on ``p`` itself (a cycle would
    keep the parameter until the garbage collector runs)."""
    if hasattr(p, "register_post_accumulate_grad_hook"):
        return p.register_post_accumulate_grad_hook(lambda *_: fn()), None
    acc = p.expand_as(p).grad_fn.next_functions[0][0]
    return acc.register_hook(lambda *_: fn()), acc


def _native_grad_hook(p, state, index):
    """The C++ hook (``_bagua_ext.GradReadyHook``) that hands p's gradient to the reducer when it
    is accumulated, running no Python (python/src/ext_hooks.cc); returns (handle, keep-alive).
    From torch 2.1 torch passes the parameter to it; before, the AccumulateGrad node's hook gets
    gradients only, so the hook holds the parameter weakly."""
    if hasattr(p, "register_post_accumulate_grad_hook"):
        return p.register_post_accumulate_grad_hook(ext.GradReadyHook(state, index)), None
    acc = p.expand_as(p).grad_fn.next_functions[0][0]
    return acc.register_hook(ext.GradReadyHook(state, index, weakref.ref(p))), acc

