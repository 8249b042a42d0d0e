"""The boundary between the tester and the student's kernel: plain values both ways
(autograder/plain.py), the kernel's side (autograder/kernel_side.py), the tester's proxies and
probes (autograder/tester.py, autograder/probes.py). The `across` fixture (tests/conftest.py)
serves a namespace over a real socket, as a graded kernel does."""
from __future__ import annotations

import math
import socket

import numpy as np
import pytest
import torch

from autograder import probes
from autograder.plain import Codec, NotPlain, ProtocolError, StudentRef, recv, send
from autograder.tester import StudentError, StudentFunction


def round_trip(value):
    out = Codec()
    tree = out.enc(value)
    a, b = socket.socketpair()
    send(a, {"v": tree}, out.blobs)
    message, blobs = recv(b)
    return Codec(blobs).dec(message["v"])


def test_plain_values_cross_unchanged():
    g = torch.Generator().manual_seed(3)
    g.manual_seed(5)
    value = {"n": None, "b": True, "i": -(1 << 70), "f": math.inf, "nan": math.nan, "s": "é",
             "l": [1, [2.5, "x"]], "t": (1, (2,)), "set": {1, 2}, 3: b"\x00\xff",
             "T": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3).t(),
             "empty": torch.zeros(0, 4, dtype=torch.int64), "bool": torch.tensor([True, False]),
             "A": np.arange(4, dtype=np.float32), "dt": torch.float16, "size": torch.Size([2, 3])}
    got = round_trip({**value, "g": g})
    assert got.keys() == {**value, "g": 0}.keys()
    for k in ("n", "b", "i", "f", "s", "l", "t", "set", 3, "dt"):
        assert got[k] == value[k] and type(got[k]) is type(value[k]), k
    assert math.isnan(got["nan"]) and got["size"] == (2, 3) and type(got["size"]) is tuple
    assert torch.equal(got["T"], value["T"]) and got["T"].dtype == torch.bfloat16
    assert got["empty"].shape == (0, 4) and got["empty"].dtype == torch.int64
    assert torch.equal(got["bool"], value["bool"]) and np.array_equal(got["A"], value["A"])
    assert torch.equal(got["g"].get_state(), g.get_state())


def test_subclasses_cross_as_their_plain_part():
    """A value's own methods never reach the tester: an int whose __eq__ says yes to anything
    arrives as the int it holds, a tensor subclass as a plain tensor."""
    class Liar(int):
        def __eq__(self, other):
            return True
        __hash__ = int.__hash__

    class Sneaky(torch.Tensor):
        pass
    got = round_trip([Liar(3), np.float64(0.5), np.int64(7), torch.ones(2).as_subclass(Sneaky)])
    assert got[:3] == [3, 0.5, 7] and [type(x) for x in got[:3]] == [int, float, int]
    assert got[0] != 4 and type(got[3]) is torch.Tensor


@pytest.mark.parametrize("value, words", [
    (torch.nn.Linear(2, 2), "torch.nn.modules.linear.Linear, which cannot cross"),
    (lambda: 1, "function, which cannot cross"),
    ([0, {"k": object()}], "an item of an item of the value is a builtins.object"),
    (np.array(["a"]), "a NumPy array of <U1, not numbers"),
])
def test_anything_else_is_refused_naming_it(value, words):
    with pytest.raises(NotPlain, match=words.replace(".", r"\.").replace("(", r"\(")):
        Codec().enc(value)


def test_what_arrives_is_checked_before_use():
    with pytest.raises(ProtocolError, match="bytes do not match"):
        Codec([b"\x00" * 5]).dec({"T": [0, "float32", [2], "cpu"]})
    with pytest.raises(ProtocolError, match="unknown tag"):
        Codec().dec({"pickle": "x"})
    with pytest.raises(ProtocolError, match="student's object"):
        Codec().dec({"S": "scale"})             # the tester never resolves the kernel's names
    deep: list = []
    for _ in range(40):
        deep = [deep]
    with pytest.raises(NotPlain, match="nested more than"):
        Codec().enc(deep)
    a, b = socket.socketpair()
    a.sendall(b"\x00\x00\x00\x05\x00\x00\x00\x00notjs")
    with pytest.raises(ProtocolError, match="not JSON"):
        recv(b)


# --- calls across a socket ------------------------------------------------------------------
def student_namespace():
    def scale(x, t):
        x.mul_(2)                                   # changes its argument in place
        return x / t

    def fill(items: list, box: dict, g: torch.Generator):
        items.append(len(items))
        box["seen"] = True
        return torch.rand(1, generator=g).item()

    class Cache:
        def __init__(self, n):
            self.n = n

    def fails():
        raise ValueError("temperature must be > 0")

    def step(state, log):
        S, z = state                                # a decode state: a tuple of tensors
        S.add_(1)
        z.mul_(2)
        log[0]["n"] += 1
        return None

    def odd():
        class Mine(Exception):
            pass
        raise Mine("a custom exception")
    return {"scale": scale, "fill": fill, "Cache": Cache, "fails": fails, "odd": odd, "step": step,
            "answer": np.float64(0.25), "model": torch.nn.Linear(2, 2)}


def test_a_call_runs_in_the_kernel_and_its_arguments_stay_the_testers(across):
    """The kernel works on copies: what a call does to its arguments never reaches the
    tester's objects (a test that checks "the input was not modified" asks a probe)."""
    connect, threads = across
    ns = connect(student_namespace())
    assert isinstance(ns["scale"], StudentFunction) and ns["answer"] == 0.25
    x = torch.ones(3)
    out = ns["scale"](x, 4.0)
    assert torch.equal(out, torch.full((3,), 0.5)) and torch.equal(x, torch.ones(3))
    items, box, g = [7], {}, torch.Generator().manual_seed(0)
    expected = torch.rand(1, generator=torch.Generator().manual_seed(0)).item()
    assert ns["fill"](items, box, g) == expected
    assert items == [7] and box == {}
    assert torch.rand(1, generator=g).item() == expected       # the generator did not advance
    S, z, log = torch.zeros(2), torch.ones(3), [{"n": 0}]
    assert ns["step"]((S, z), log) is None
    assert ns["step"](state=(S, z), log=log) is None                 # by keyword too
    assert S.tolist() == [0.0, 0.0] and z.tolist() == [1.0] * 3 and log == [{"n": 0}]
    assert threads and all(t.name != "MainThread" for t in threads)


def test_what_cannot_cross_fails_the_call_with_a_reason(across):
    connect, _ = across
    ns = connect(student_namespace())
    with pytest.raises(TypeError, match="what your Cache returned is a .*Cache, which cannot"):
        ns["Cache"](3)
    with pytest.raises(NotPlain, match="Linear, which cannot cross"):
        ns["scale"](torch.nn.Linear(2, 2), 1.0)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        ns["fails"]()
    with pytest.raises(StudentError, match="Mine: a custom exception"):
        ns["odd"]()


def test_a_probe_runs_where_the_student_code_lives(across):
    connect, threads = across
    seen = []

    @probes.probe
    def doubled(fn, n):
        seen.append("kernel")
        return fn(torch.ones(n), 1.0).tolist()
    ns = connect(student_namespace())
    assert doubled(ns["scale"], 2) == [2.0, 2.0] and seen == ["kernel"]
    probes._CONNECTION, kernel = None, probes._CONNECTION
    try:                                       # no test running: an ordinary call
        assert doubled(student_namespace()["scale"], 1) == [2.0]
    finally:
        probes._CONNECTION = kernel
    with pytest.raises(Exception, match="no probe"):
        kernel.probe("autograder.labs.lab00:nothing", (), {})
    assert isinstance(StudentRef("x"), StudentRef)
