"""Modules and course objects copied into the student's kernel (autograder/remote.py), for a lab
whose tests hand the student's code a model or a layer to read, convert or run itself
(`{"autograder": {"tests": "tester", "modules": "copy"}}` in its source notebook's metadata).

By default the tester's model crosses as a stand-in (`stand_in`) whose forward runs in the
tester, so the tester counts and times its passes. In "copy" labs the student's functions take
a model apart instead (lab 03 pools its key/value heads, reads its layers' windows; lab 05's
drafter packs a small model's weights), so a `torch.nn.Module` crosses whole, by value: its
class (one of `minillm`'s or `torch`'s), its plain attributes, its parameters and buffers (as
tensors), its submodules; an object of a course class (`minillm`'s, or a lab module's such as
lab 05's OracleDrafter; cla.SharedKV inside a model) crosses the same way. What one message
holds twice (a submodule two layers share, tied embedding weights) arrives once and is shared
again. A model that a `WorkCounter` is counting when it crosses goes as a stand-in even in a
"copy" lab: the test counts its passes, so they must run in the tester.

Only the tester sends objects this way: the student's side refuses nothing it gets from the
tester, and the tester refuses these tags from the student's side (its objects stay handles).
A copied argument that the student's call changes comes back like any other argument
(autograder/remote_copyback.py): new weight values are copied into the tester's parameters;
a replaced submodule, parameter or attribute of a module cannot be, and fails the call with a
message that says so (a course object that is not a module, such as cla.SharedKV, is scratch
space that running the model changes: it is not compared).
"""
from __future__ import annotations

import functools
import importlib

from .wire import ProtocolError, _list, _pairs

__all__ = ["COPY_PACKAGES", "copies", "whole", "encode", "decode", "parts", "specs_of",
           "stand_in"]

COPY_PACKAGES = ("minillm", "torch", "autograder")   # the classes whose objects cross whole
COPY_OBJECTS = ("minillm", "autograder.labs")  # ... those whose plain objects do (not modules)


@functools.cache
def _internals() -> frozenset:
    """What every module's __dict__ holds (hooks, the parts' own dicts): never sent."""
    import torch
    return frozenset(vars(torch.nn.Module()))


def whole(v) -> bool:
    """Whether `v` is what crosses whole in a "copy" lab: a module, or an object of a course
    class with plain attributes (not a class or a function)."""
    import torch
    if isinstance(v, torch.nn.Module):
        return True
    home = type(v).__module__
    return any(home == p or home.startswith(p + ".") for p in COPY_OBJECTS) and \
        hasattr(v, "__dict__") and not isinstance(v, type) and not callable(v)


def copies(v) -> bool:
    """Whether the tester sends `v` whole: `whole(v)`, unless `v` is a model that a
    `WorkCounter` of the test is counting, which crosses as a stand-in (`stand_in`) so that
    its forward passes run, and are counted, in the tester."""
    from minillm.timing import WorkCounter
    return whole(v) and not WorkCounter.counting(v)


def parts(m) -> list[tuple[str, object]]:
    """What module `m` holds, by name: its plain attributes, training flag, parameters, buffers
    and submodules. The copy-back compares these by identity."""
    out = [("training", m.training)]
    out += [(k, x) for k, x in vars(m).items() if k not in _internals()]
    out += [(f"parameter {k}", p) for k, p in m._parameters.items()]
    out += [(f"buffer {k}", b) for k, b in m._buffers.items()]
    out += [(f"module {k}", c) for k, c in m._modules.items()]
    return out


def encode(codec, v, depth: int):
    """`v` (a module, a parameter, or a course object) as one value of `codec`'s message."""
    import torch
    sent = codec.sent
    if id(v) in sent:
        return {"or": sent[id(v)]}
    sent[id(v)] = len(sent)
    codec.alive.append(v)                # no other object may take its id while encoding
    if isinstance(v, torch.nn.Parameter):            # its values, and its gradient if any
        return {"P": [codec.tensor(v), bool(v.requires_grad),
                      None if v.grad is None else codec.enc(v.grad, depth + 1)]}
    cls = type(v)
    if cls.__module__.split(".")[0] not in COPY_PACKAGES:
        raise ProtocolError(f"a {cls.__qualname__} of {cls.__module__} cannot be copied to the "
                            "student's code: only minillm's and torch's modules and the "
                            "course's objects cross whole")
    codec.mutables.append(v)             # registered before its parts, as decode does
    if not isinstance(v, torch.nn.Module):
        return {"O": [cls.__module__, cls.__qualname__,
                      [[str(k), codec.enc(x, depth + 1)] for k, x in vars(v).items()]]}
    attrs = [[k, codec.enc(x, depth + 1)] for k, x in vars(v).items() if k not in _internals()]
    params = [[k, None if p is None else encode(codec, p, depth + 1)]
              for k, p in v._parameters.items()]
    buffers = [[k, None if b is None else codec.enc(b, depth + 1)] for k, b in v._buffers.items()]
    children = [[k, None if c is None else encode(codec, c, depth + 1)]
                for k, c in v._modules.items()]
    return {"M": [cls.__module__, cls.__qualname__, bool(v.training), attrs, params, buffers,
                  sorted(v._non_persistent_buffers_set), children]}


def _class(module, qualname, base):
    if type(module) is not str or module.split(".")[0] not in COPY_PACKAGES:
        raise ProtocolError(f"a class of {str(module)[:60]}")
    cls = importlib.import_module(module)
    for part in str(qualname).split("."):
        cls = getattr(cls, part)
    if not isinstance(cls, type) or (base is not None and not issubclass(cls, base)):
        raise ProtocolError(f"{str(module)[:60]}.{str(qualname)[:60]} is not a class to copy")
    return cls


def decode(codec, tag: str, x, depth: int):
    """The object `encode` sent, rebuilt on the student's side (without running its
    __init__: its state is set as it was sent)."""
    import torch
    got = codec.got
    if tag == "or":
        if type(x) is not int or not 0 <= x < len(got) or got[x] is None:
            raise ProtocolError("a reference to an object not sent before")
        return got[x]
    i = len(got)
    got.append(None)
    if tag == "P":
        t, requires_grad, grad = _list(x, 3)
        slot, at = len(codec.mutables), len(codec.tensors)
        data = codec.dec(t, depth + 1)
        if not (isinstance(data, torch.Tensor) and len(codec.tensors) > at
                and codec.tensors[at] is data):
            raise ProtocolError("a parameter that is not a tensor")
        p = got[i] = torch.nn.Parameter(data, requires_grad=bool(requires_grad)
                                        and (data.is_floating_point() or data.is_complex()))
        codec.mutables[slot] = codec.tensors[at] = p     # the parameter is what comes back
        if grad is not None:
            g = codec.dec(grad, depth + 1)
            if not (isinstance(g, torch.Tensor) and p.requires_grad and g.shape == p.shape
                    and g.dtype == p.dtype):
                raise ProtocolError("a parameter's gradient that does not fit it")
            p.grad = g
        return p
    if tag == "O":
        module, qualname, attrs = _list(x, 3)
        cls = _class(module, qualname, None)
        obj = got[i] = cls.__new__(cls)
        codec.mutables.append(obj)
        for k, v in _pairs(attrs):
            obj.__dict__[str(k)] = codec.dec(v, depth + 1)
        return obj
    module, qualname, training, attrs, params, buffers, transient, children = _list(x, 8)
    cls = _class(module, qualname, torch.nn.Module)
    m = got[i] = cls.__new__(cls)
    torch.nn.Module.__init__(m)
    codec.mutables.append(m)
    m.training = bool(training)
    for k, v in _pairs(attrs):
        m.__dict__[str(k)] = codec.dec(v, depth + 1)
    for k, v in _pairs(params):
        m._parameters[str(k)] = None if v is None else codec.dec(v, depth + 1)
    for k, v in _pairs(buffers):
        m._buffers[str(k)] = None if v is None else codec.dec(v, depth + 1)
    m._non_persistent_buffers_set.update(str(k) for k in _list(transient))
    for k, v in _pairs(children):
        m._modules[str(k)] = None if v is None else codec.dec(v, depth + 1)
    return m


def specs_of(model) -> list | None:
    """What each layer of the tester's `model` caches (minillm.kvcache.layer_specs), for its
    stand-in; None for a model without such layers."""
    from minillm.kvcache import layer_specs
    try:
        return layer_specs(model)
    except (AttributeError, TypeError):
        return None


def stand_in(remote, config, device: str, dtype, specs=None):
    """The tester's model as the student's code sees it: a torch module with the model's
    `config`, one empty parameter on the model's device and dtype (so `model.parameters()`
    says where inputs go) and, with `specs`, one stand-in layer per layer whose
    `self_attn.kv_spec()` says what it caches (so `KVCache.for_model` can shape a cache for
    it), whose forward runs the tester's model: the tester counts and times every call, and
    the student's kernel never holds the weights it would need to fake one."""
    import torch

    class StandInAttention(torch.nn.Module):
        def __init__(self, spec):
            super().__init__()
            self.spec, self.window = spec, getattr(spec, "window", None)

        def kv_spec(self):
            return self.spec

        def forward(self, *args, **kwargs):
            raise RuntimeError("a stand-in for a layer of the grader's model: the grader runs "
                               "the model's passes; call the model itself")

    class StandInLayer(torch.nn.Module):
        def __init__(self, spec):
            super().__init__()
            self.self_attn = StandInAttention(spec)

        forward = StandInAttention.forward

    class StandIn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = config
            self.anchor = torch.nn.Parameter(torch.empty(0, device=device, dtype=dtype),
                                             requires_grad=False)
            if specs is not None:
                self.layers = torch.nn.ModuleList(StandInLayer(s) for s in specs)
            object.__setattr__(self, "_remote", remote)

        def forward(self, *args, **kwargs):
            return self._remote(*args, **kwargs)

        def extra_repr(self) -> str:
            return "the grader's model, run by the tester"

    return StandIn()
