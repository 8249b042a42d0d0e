"""In-place copy-back across the grading boundary (autograder/remote.py): a list, dict, tensor
or Generator passed to the other side's function comes back when the call changed it, and the
caller copies the new value into its own object.

The serving side takes a `snapshot` of each such argument before the call and asks it
afterwards whether the argument still `holds` the same: a list or dict by the identity of its
items (kept alive by the snapshot, so no new item can take an old one's address; the lists,
dicts and tensors inside it are arguments of their own, compared by content), a tensor by its
dtype, shape, device and a copy of its values, a Generator by its state. The caller then
`copy_into` its own object what came back.
"""
from __future__ import annotations

from .wire import ProtocolError

__all__ = ["snapshot", "copy_into"]


def snapshot(m):
    """What argument `m` holds now; `.holds(m)` says later whether it still does."""
    if type(m) is list:
        return _Items(list(m))
    if type(m) is dict:
        return _Items([x for item in m.items() for x in item])
    return _Contents(m)


class _Items:
    """A list's items or a dict's keys and values, compared by identity (`snapshot`)."""
    __slots__ = ("items",)

    def __init__(self, items: list):
        self.items = items

    def holds(self, m) -> bool:
        now = list(m) if type(m) is list else [x for item in m.items() for x in item]
        return len(now) == len(self.items) and all(x is y for x, y in zip(now, self.items))


class _Contents:
    """A tensor's dtype, shape and values (a copy), or a Generator's state (`snapshot`).
    A tensor holding NaN never equals its copy: it is sent back unchanged, which is harmless."""
    __slots__ = ("kind", "copy")

    def __init__(self, t):
        import torch
        if isinstance(t, torch.Generator):
            self.kind, self.copy = None, t.get_state()
        else:
            self.kind, self.copy = (t.dtype, tuple(t.shape), t.device), t.detach().clone()

    def holds(self, t) -> bool:
        import torch
        if self.kind is None:
            return torch.equal(t.get_state(), self.copy)
        return (t.dtype, tuple(t.shape), t.device) == self.kind and \
            torch.equal(t.detach(), self.copy)


def copy_into(dest, new) -> None:
    """Copy `new`, what came back for argument `dest`, into `dest` itself."""
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
