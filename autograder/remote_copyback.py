"""In-place copy-back across the grading boundary (autograder/remote.py): a list, dict, tensor
or Generator passed to the other side's function comes back when the call changed it, and the
caller copies the new value into its own object.

The serving side takes a `snapshot` of each such argument before the call and asks it
afterwards whether the argument still `holds` the same: a list or dict by the identity of its
items (kept alive by the snapshot, so no new item can take an old one's address; the lists,
dicts and tensors inside it are arguments of their own, compared by content), a tensor by its
dtype, shape, device and a copy of its values and of its gradient (a parameter the student's
code trained comes back with the gradient it left, so a test sees a teacher that got gradients
or a step that did not zero them), a Generator by its state, a module copied whole
(autograder/remote_objects.py) by the identity of its parts (its parameters' values are
arguments of their own; another course object it holds, scratch space for its forward pass,
is not compared). The caller then `copy_into` its own object what came back: a module
whose parts were replaced cannot be, and the call fails saying so.
"""
from __future__ import annotations

from . import remote_objects
from .wire import ProtocolError

__all__ = ["snapshot", "copy_into"]


def snapshot(m):
    """What argument `m` holds now; `.holds(m)` says later whether it still does."""
    if type(m) is list:
        return _Items(list(m))
    if type(m) is dict:
        return _Items([x for item in m.items() for x in item])
    if remote_objects.whole(m):
        return _Parts(m) if hasattr(m, "_modules") else _Scratch()   # a module, or scratch
    return _Contents(m)


class _Items:
    """A list's items or a dict's keys and values, compared by identity (`snapshot`)."""
    __slots__ = ("items",)

    def __init__(self, items: list):
        self.items = items

    def holds(self, m) -> bool:
        now = list(m) if type(m) is list else [x for item in m.items() for x in item]
        return len(now) == len(self.items) and all(x is y for x, y in zip(now, self.items))


class _Scratch:
    """A copied course object that is not a module (cla.SharedKV: what a forward pass leaves
    for the next layer): running the model changes it, and nothing is compared."""
    __slots__ = ()

    def holds(self, m) -> bool:
        return True


class _Parts:
    """A copied module's parts by name, compared by identity."""
    __slots__ = ("parts",)

    def __init__(self, m):
        self.parts = remote_objects.parts(m)

    def holds(self, m) -> bool:
        now = remote_objects.parts(m)
        return len(now) == len(self.parts) and all(
            k == k0 and (x is x0 or (type(x) in (bool, int, float, str) and type(x) is type(x0)
                                    and x == x0))
            for (k, x), (k0, x0) in zip(now, self.parts))


class _Contents:
    """A tensor's dtype, shape and values (a copy) and its gradient (a copy, or None), or a
    Generator's state (`snapshot`). A tensor holding NaN never equals its copy: it is sent
    back unchanged, which is harmless."""
    __slots__ = ("kind", "copy", "grad")

    def __init__(self, t):
        import torch
        if isinstance(t, torch.Generator):
            self.kind, self.copy, self.grad = None, t.get_state(), None
        else:
            self.kind, self.copy = (t.dtype, tuple(t.shape), t.device), t.detach().clone()
            self.grad = None if t.grad is None else t.grad.detach().clone()

    def holds(self, t) -> bool:
        import torch
        if self.kind is None:
            return torch.equal(t.get_state(), self.copy)
        same_grad = (t.grad is None and self.grad is None) or (
            t.grad is not None and self.grad is not None and t.grad.shape == self.grad.shape
            and t.grad.dtype == self.grad.dtype and torch.equal(t.grad.detach(), self.grad))
        return (t.dtype, tuple(t.shape), t.device) == self.kind and same_grad and \
            torch.equal(t.detach(), self.copy)


def copy_into(dest, new, *grad) -> None:
    """Copy `new`, what came back for argument `dest`, into `dest` itself (and `grad`, when
    given, its gradient there, into `dest.grad`: a parameter of a copied module that the
    student's code trained, or a tensor the tester differentiates)."""
    import torch
    if type(dest) in (list, dict):
        if type(new) is not type(dest):
            raise ProtocolError("a changed argument came back as something else")
        if type(dest) is list:
            dest[:] = new
        else:
            dest.clear()
            dest.update(new)
        return
    if remote_objects.whole(dest):
        raise ValueError(f"the student's code changed the {type(dest).__name__} it was given in "
                         "place: it replaced a layer, a weight or an attribute such as its config "
                         "(new values in its weights are copied back, new parts cannot be); "
                         "build a new object instead of changing the one you were given")
    if isinstance(dest, torch.Generator):
        if not isinstance(new, torch.Generator):
            raise ProtocolError("a generator came back as something else")
        dest.set_state(new.get_state())
        return
    if not isinstance(new, torch.Tensor) or new.shape != dest.shape or new.dtype != dest.dtype:
        raise ValueError("the student's code changed the shape or dtype of a tensor argument in "
                         f"place ({tuple(dest.shape)} {dest.dtype} -> "
                         f"{tuple(getattr(new, 'shape', ()))} {getattr(new, 'dtype', None)})")
    with torch.no_grad():
        dest.copy_(new.to(dest.device))
    if grad and dest.is_leaf and dest.requires_grad:
        (g,) = grad
        if g is not None and not (isinstance(g, torch.Tensor) and g.shape == dest.shape
                                  and g.dtype == dest.dtype):
            raise ValueError(f"the student's code left a gradient of {tuple(dest.shape)} "
                             f"{dest.dtype} that does not fit it")
        dest.grad = None if g is None else g.to(dest.device)
