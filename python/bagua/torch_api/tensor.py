"""Bagua's tensor methods on ``torch.Tensor`` (``BaguaTensor``), for custom algorithms.

A Bagua tensor is a *proxy* (usually a parameter) plus a getter that returns the *effective*
tensor communicated (usually its gradient) and an optional setter that replaces it, so the
effective tensor may be reallocated between iterations and communication still finds it.

Differences from Bagua: there is no separate backend tensor object. ``bagua_backend_tensor()``
returns the effective tensor itself (what our communicator methods take), and
``bagua_mark_communication_ready()`` tells the module's Python engine
(``data_parallel.python_engine``), which runs a bucket's operations once every tensor of it is
ready. The built-in algorithms run in the C++ reducer and never go through here.
"""

import torch

__all__ = ["BaguaTensor"]


class BaguaTensor:
    """The methods patched onto ``torch.Tensor`` (every name contains ``bagua``, as in Bagua)."""

    def is_bagua_tensor(self):
        return "_bagua_getter" in self.__dict__

    def ensure_bagua_tensor(self, name=None, module_name=None, getter_closure=None,
                            setter_closure=None):
        """Makes this tensor a Bagua tensor in place and returns it. ``module_name``
        (``model.bagua_module_name``) is required to mark it ready later; ``getter_closure``
        maps the proxy to the effective tensor (default: itself), ``setter_closure(proxy, t)``
        replaces the effective tensor."""
        if self.is_bagua_tensor():
            if name is not None and self.bagua_tensor_name != name:
                raise ValueError("bagua: tensor {!r} cannot be renamed to {!r}".format(
                    self.bagua_tensor_name, name))
            if module_name is not None and self.bagua_module_name != module_name:
                raise ValueError("bagua: tensor {!r} belongs to module {!r}, not {!r}".format(
                    self.bagua_tensor_name, self.bagua_module_name, module_name))
            if (getter_closure == self._bagua_getter and setter_closure == self._bagua_setter):
                return self
        if setter_closure is not None and getter_closure is None:
            raise ValueError("bagua: a setter_closure needs a getter_closure")
        from .communication import get_backend

        self.bagua_tensor_name = name if name is not None else ""
        self.bagua_module_name = module_name
        self.bagua_backend = get_backend(module_name) if module_name is not None else None
        self.__dict__["_bagua_getter"] = getter_closure
        self.__dict__["_bagua_setter"] = setter_closure
        self._bagua_bucket = None
        return self

    def to_bagua_tensor(self, name=None, module_name=None, getter_closure=None,
                        setter_closure=None):
        """A new Bagua tensor sharing this tensor's storage (a view)."""
        return self.view(self.dtype).ensure_bagua_tensor(name, module_name, getter_closure,
                                                         setter_closure)

    def bagua_getter_closure(self):
        """The effective tensor."""
        g = self.__dict__.get("_bagua_getter")
        return g(self) if g is not None else self

    def bagua_setter_closure(self, tensor):
        """Replaces the effective tensor with ``tensor``."""
        s = self.__dict__.get("_bagua_setter")
        if s is None:
            raise RuntimeError("bagua: tensor {!r} has no setter_closure".format(
                getattr(self, "bagua_tensor_name", "")))
        s(self, tensor)

    def bagua_backend_tensor(self):
        """The tensor the communicator works on: the effective tensor."""
        return self.bagua_getter_closure() if self.is_bagua_tensor() else self

    def bagua_ensure_grad(self):
        """Gives a parameter a zero gradient if it has none; returns the parameter."""
        if self.grad is not None:
            return self
        if isinstance(self, torch.nn.Parameter):
            with torch.no_grad():
                self.grad = torch.zeros_like(self.data)
            return self
        raise NotImplementedError("bagua_ensure_grad: only parameters get a gradient")

    def bagua_mark_communication_ready(self):
        """Marks this tensor ready: its bucket's operations run once all its tensors are."""
        if getattr(self, "bagua_backend", None) is None:
            raise RuntimeError("bagua: tensor {!r} was made without module_name; it cannot be "
                               "marked ready".format(getattr(self, "bagua_tensor_name", "")))
        self.bagua_backend.mark_communication_ready(self)

    def bagua_mark_communication_ready_without_synchronization(self):
        self.bagua_mark_communication_ready()

    def bagua_set_storage(self, storage, storage_offset=0):
        """Makes the effective tensor use ``storage`` from ``storage_offset`` (through the
        setter when there is one)."""
        eff = self.bagua_getter_closure()
        with torch.no_grad():
            if self.__dict__.get("_bagua_setter") is None:
                eff.set_(storage, storage_offset, eff.shape)
                return
            t = torch.zeros_like(eff)
            t.set_(storage, storage_offset, t.shape)
            self.bagua_setter_closure(t)


def _install():
    for name, fn in vars(BaguaTensor).items():
        if "bagua" in name and callable(fn):
            setattr(torch.Tensor, name, fn)


_install()
