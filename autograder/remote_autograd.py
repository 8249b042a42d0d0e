"""Gradients across the grading boundary (autograder/remote.py), for a test that differentiates
through the student's function: lab 08 calls `loss.backward()` on the student's distillation
loss and reads the logits' gradient, and writes out a reference training step whose loss is
the student's.

The student's autograd graph is made by the student's code, in the kernel; it cannot cross.
So a call from the tester with grad mode on, whose tensors include some that require gradients,
is one node of the tester's graph (`call`, a `torch.autograd.Function`):

* forward: the tester sends the call as a "gcall" with the positions of those tensors among
  the message's tensors; the kernel makes its copies of them leaves that require gradients,
  runs the call with grad mode on and keeps the graph (`Graph`): the reply is the result, by
  value as usual, and a handle on the graph;
* backward: the tester sends the gradients of the result ("grad" on the handle); the kernel
  answers with the gradients of its leaves (`torch.autograd.grad`, run with the same
  references disabled as the call), which autograd checks against each input's shape and
  hands on to the rest of the tester's graph.

A result that is a tensor, or a tuple or list of tensors, is differentiable; any other result
comes back as it would without gradients. What the kernel answers is only as trustworthy as
the student's result itself: it is the student's code either way. The kernel keeps each graph
until the test ends (a second backward through it works, as with `retain_graph=True`).
"""
from __future__ import annotations

from .wire import ProtocolError

__all__ = ["wanted", "call", "leaves", "Graph"]


def wanted(args, kwargs) -> bool:
    """(The tester) Whether a call with these arguments is to be differentiable: grad mode is
    on and a tensor among them (in lists, tuples, dicts' values) requires a gradient. Modules
    are not searched: a call that only hands the student a copied model to train is not a node
    of the test's graph (its parameters come back with their gradients, remote_copyback.py);
    in a differentiable call, their parameters are inputs of the node like any tensor."""
    import torch
    if not torch.is_grad_enabled():
        return False
    todo, seen = [args, kwargs], 0
    while todo and seen < 100_000:
        v = todo.pop()
        seen += 1
        if isinstance(v, torch.Tensor):
            if v.requires_grad:
                return True
        elif type(v) in (list, tuple):
            todo.extend(v)
        elif type(v) is dict:
            todo.extend(v.values())
    return False


def call(ep, target: int, args: tuple, kwargs: dict, handle_type: type):
    """(The tester) The student's function `target` called on `args`, `kwargs` as a node of the
    tester's autograd graph (`handle_type`: remote_values.Remote, what the graph comes back as)."""
    import torch
    msg, codec = ep.prepare("gcall", target, args, kwargs)
    marked = [i for i, t in enumerate(codec.tensors)
              if t.requires_grad and (t.is_floating_point() or t.is_complex())]
    msg["args"].append({"T": marked})            # a tuple of ints, as the codec writes it
    inputs = [codec.tensors[i] for i in marked]
    box: dict = {}

    class Crossing(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            reply = ep.exchange(msg, codec, copy_back=True)
            if type(reply) is not list or len(reply) != 2:
                raise ProtocolError("a differentiable call's reply is [result, graph]")
            box["value"], ctx.graph = reply
            if ctx.graph is not None and not (isinstance(ctx.graph, handle_type)
                                              and ctx.graph._ep is ep):
                raise ProtocolError("a differentiable call's graph is not a handle")
            outs = _outputs(box["value"])
            if ctx.graph is None or outs is None:
                box["plain"] = True
                return torch.empty(0)
            ctx.mark_non_differentiable(*(o for o in outs if not (o.is_floating_point()
                                                                   or o.is_complex())))
            return tuple(outs)

        @staticmethod
        def backward(ctx, *grads):
            if ctx.graph is None:
                return (None,) * len(inputs)
            got = ep.request("grad", ctx.graph._id, list(grads))
            if type(got) is not list or len(got) != len(inputs) or not all(
                    g is None or isinstance(g, torch.Tensor) for g in got):
                raise ProtocolError(f"the kernel's gradients: {len(inputs)} tensors or None "
                                    "expected")
            return tuple(got)

    outs = Crossing.apply(*inputs)
    if box.get("plain"):
        return box["value"]
    value = box["value"]
    if isinstance(value, torch.Tensor):
        return outs[0]
    return type(value)(outs)


def _outputs(value) -> list | None:
    import torch
    if isinstance(value, torch.Tensor):
        return [value]
    if type(value) in (list, tuple) and value and all(isinstance(v, torch.Tensor)
                                                      for v in value):
        return list(value)
    return None


def leaves(tensors: list, marked) -> list:
    """(The kernel) The tensors of a "gcall" message that the tester differentiates by: made
    leaves that require gradients."""
    if type(marked) is not tuple or not all(type(i) is int and 0 <= i < len(tensors)
                                           for i in marked):
        raise ProtocolError("a differentiable call names tensors it did not send")
    out = []
    for i in marked:
        t = tensors[i]
        if not (t.is_floating_point() or t.is_complex()):
            raise ProtocolError("a differentiable call names a tensor of integers")
        if not t.requires_grad:
            t.requires_grad_(True)
        out.append(t)
    return out


class Graph:
    """(The kernel) A differentiable call's leaves and result, kept for the tester's backward."""

    def __init__(self, inputs: list, outputs: list):
        self.inputs, self.outputs = inputs, outputs

    @staticmethod
    def run(fn, args: tuple, kwargs: dict, inputs: list):
        """`fn(*args, **kwargs)` with grad mode on: [its result, a Graph or None]."""
        import torch
        with torch.enable_grad():
            value = fn(*args, **kwargs)
        outs = _outputs(value)
        if outs is None or not any(o.requires_grad for o in outs):
            return [value, None]
        return [value, Graph(inputs, outs)]

    def backward(self, grads) -> list:
        """The gradients of the inputs, given the gradients of the outputs (None: unused)."""
        import torch
        if type(grads) is not list or len(grads) != len(self.outputs):
            raise ProtocolError("gradients for a different number of outputs")
        pairs = [(o, g) for o, g in zip(self.outputs, grads)
                 if g is not None and o.requires_grad]
        if not pairs:
            return [None] * len(self.inputs)
        return list(torch.autograd.grad([o for o, _ in pairs], self.inputs,
                                        [g for _, g in pairs], allow_unused=True,
                                        retain_graph=True))
