"""autograder/remote.py and autograder/tester.py: the tester calls the student's code across a
socket. Here both ends run in this process (the student's end in a thread); the graded path,
with a real kernel, is in tests/test_split_grading.py."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from autograder import remote, remote_values, wire
from autograder.tester import Namespace

REPO = Path(__file__).resolve().parent.parent


class Pair:
    """A tester endpoint here, a student endpoint serving `namespace` in a thread."""

    def __init__(self, namespace: dict, copy_modules: bool = False):
        a, b = socket.socketpair()
        self.student = remote.Endpoint(b, share_handles=True, namespace=namespace)
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        self.ns = Namespace()
        self.ns["torch"] = torch            # as the lab's setup cell binds it in the tester
        self.ns.endpoint = remote.Endpoint(a, share_handles=False, copy_modules=copy_modules)
        self.ns.student_names = frozenset(namespace)

    def _serve(self):
        try:
            self.student.serve()
        except BaseException as e:       # noqa: BLE001
            self.errors.append(e)

    def run(self, source: str) -> dict:
        exec(compile(source, "<test>", "exec"), self.ns)
        return self.ns

    def close(self):
        self.ns.endpoint.request("done", None)
        self.thread.join(10)
        assert not self.errors, self.errors


def student(source: str) -> dict:
    ns: dict = {"torch": torch}
    exec(source, ns)
    return ns


def test_values_cross_both_ways_by_value():
    p = Pair(student("def f(x, t, opts):\n"
                     "    return {'y': x / t, 'n': len(opts), 'kind': x.dtype, 'shape': x.shape,"
                     " 'nan': float('nan'), 'big': 10**30, 'set': {1, 2}, 'none': None}"))
    ns = p.run("x = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)\n"
               "out = f(x, 2.0, [1, (2, 3), 'a'])")
    out = ns["out"]
    assert torch.equal(out["y"], torch.arange(6, dtype=torch.bfloat16).reshape(2, 3) / 2)
    assert out["kind"] is torch.bfloat16 and out["shape"] == (2, 3) and out["n"] == 3
    assert out["nan"] != out["nan"] and out["big"] == 10**30 and out["set"] == {1, 2}
    assert out["none"] is None
    p.close()


def test_an_argument_changed_in_place_comes_back():
    p = Pair(student("def fill(out, g, log, seen):\n"
                     "    out.copy_(torch.rand(out.shape, generator=g))\n"
                     "    log.append(len(log))\n"
                     "    seen['filled'] = True\n"
                     "def resize(x):\n"
                     "    x.resize_(7)\n"
                     "def keep(ids):\n"
                     "    return len(ids)\n"))
    ns = p.run("buf = torch.zeros(3)\ng = torch.Generator().manual_seed(0)\n"
               "log, seen, ids = [7], {}, [1, 2]\nfill(buf, g, log, seen)\n"
               "after = torch.rand(1, generator=g)\nn = keep(ids)")
    assert ns["log"] == [7, 1] and ns["seen"] == {"filled": True}
    assert ns["ids"] == [1, 2] and ns["n"] == 2
    g = torch.Generator().manual_seed(0)
    assert torch.equal(ns["buf"], torch.rand(3, generator=g))
    assert torch.equal(ns["after"], torch.rand(1, generator=g)), "the generator did not advance"
    with pytest.raises(ValueError, match="changed the shape or dtype"):
        p.run("resize(torch.zeros(2))")
    p.close()


def test_a_resident_input_is_sent_once_and_crosses_back_as_the_kernels_own():
    """remote.resident: a speed check's inputs copied into the kernel once; the timed calls
    pass handles that the kernel reads as its own objects (no bytes sent again), and a fresh
    list of them each call, so a call that empties its list cannot shorten the next one."""
    p = Pair(student("def total(xs, w):\n"
                     "    out = sum(float(x.sum()) for x in xs) * float(w.sum())\n"
                     "    xs.clear()\n"
                     "    return [out, id(w)]\n"))
    remote.CURRENT = p.ns.endpoint
    try:
        ns = p.run("from autograder.remote import resident\n"
                   "xs, w = [torch.ones(3), torch.ones(2)], torch.full((4,), 0.5)\n"
                   "xs_k, w_k = resident(list(xs)), resident(w)\n"
                   "a = total(list(xs_k), w_k)\nb = total(list(xs_k), w_k)")
    finally:
        remote.CURRENT = None
    assert ns["a"][0] == ns["b"][0] == 10.0 and ns["a"][1] == ns["b"][1]
    assert all(isinstance(x, remote.Remote) for x in ns["xs_k"] + [ns["w_k"]])
    with pytest.raises(remote.StudentError, match="PermissionError"):
        p.run("w_k.sum()")                   # a handle to the kernel's copy: call-only
    assert remote.resident([1, 2]) == [1, 2]           # no tester: the value itself
    p.close()


def test_exceptions_keep_builtin_types_only():
    p = Pair(student("class Mine(Exception):\n    pass\n"
                     "def bad(t):\n    if t <= 0:\n        raise ValueError(f'T={t}')\n"
                     "def odd():\n    raise Mine('nope')\n"))
    p.run("try:\n    bad(0)\nexcept ValueError as e:\n    msg = str(e)\n")
    assert p.ns["msg"] == "T=0"
    with pytest.raises(remote.StudentError, match="Mine: nope"):
        p.run("odd()")
    p.close()


def test_the_tester_counts_the_calls_of_its_own_model():
    p = Pair(student("def generate(model, ids, n):\n"
                     "    for _ in range(n):\n"
                     "        ids = ids + [int(model(torch.tensor(ids)).argmax())]\n"
                     "    return ids\n"
                     "def peek(model):\n    return model.weight\n"
                     "def escape(model):\n    return model.__globals__\n"))
    ns = p.run("calls = []\n"
               "def model(x):\n    calls.append(len(x))\n    return torch.arange(5.0)\n"
               "out = generate(model, [1, 2], 3)")
    assert ns["out"] == [1, 2, 4, 4, 4] and ns["calls"] == [2, 3, 4]
    for name in ("peek", "escape"):      # the student's kernel can only call the model
        with pytest.raises((remote.StudentError, AttributeError),
                           match="PermissionError|__globals__"):
            p.run(f"{name}(model)")
    p.close()


def test_the_testers_model_is_a_stand_in_module_in_the_kernel():
    """A torch module of the tester's crosses as a module whose forward runs in the tester: the
    student's code reads its config and its device, and calls it; the weights stay out."""
    p = Pair(student("def look(model, ids):\n"
                     "    dev = next(model.parameters()).device\n"
                     "    logits = model(torch.as_tensor(ids, device=dev), last_only=True)\n"
                     "    return [model.config.temperature, str(dev), isinstance(model,"
                     " torch.nn.Module), sum(p.numel() for p in model.parameters()),"
                     " logits.tolist()]\n"))
    ns = p.run("from minillm.sampling import SamplingParams\n"
               "class M(torch.nn.Module):\n"
               "    def __init__(self):\n"
               "        super().__init__()\n"
               "        self.config = SamplingParams(temperature=0.5)\n"
               "        self.w = torch.nn.Parameter(torch.ones(3))\n"
               "        self.calls = 0\n"
               "    def forward(self, ids, last_only=False):\n"
               "        self.calls += 1\n"
               "        return self.w * ids.sum() + (100 if last_only else 0)\n"
               "m = M()\nout = look(m, [1, 2])")
    assert ns["out"] == [0.5, "cpu", True, 0, [103.0, 103.0, 103.0]]
    assert ns["m"].calls == 1
    p.close()


def test_a_simple_namespace_crosses_by_value_to_the_student_only():
    """A test's SimpleNamespace record (lab 06 builds finished requests so) reaches the
    student's code as a SimpleNamespace of the same fields; the student's side cannot send one
    back (it stays there as a handle, like any object of its own)."""
    p = Pair(student("import types\n"
                     "def span(s):\n"
                     "    return [type(s).__name__, s.finish_time - s.arrival_time, s.tags]\n"
                     "def make():\n"
                     "    return types.SimpleNamespace(a=1)\n"))
    ns = p.run("from types import SimpleNamespace\n"
               "out = span(SimpleNamespace(arrival_time=1.0, finish_time=2.5, tags=['x']))\n"
               "back = make()\nr = repr(back)")
    assert ns["out"] == ["SimpleNamespace", 1.5, ["x"]]
    assert isinstance(ns["back"], remote.Remote) and "namespace(a=1)" in ns["r"]
    p.close()
    codec = remote_values.Codec(remote.Endpoint(socket.socketpair()[0], share_handles=False))
    with pytest.raises(remote.ProtocolError, match="does not accept"):
        codec.dec({"ns": [["a", 1]]})
    kernel = remote_values.Codec(remote.Endpoint(socket.socketpair()[0], share_handles=True))
    with pytest.raises(remote.ProtocolError, match="not an attribute name"):
        kernel.dec({"ns": [["__class__", 1]]})


def test_sympy_expressions_cross_as_trees_never_as_code():
    """Lab 01's answers are SymPy expressions: they cross as trees of numbers, symbols (with
    their assumptions, so the kernel's B equals the tester's) and known operators; a function
    of the student's own, an unknown assumption or a power too large to rebuild is refused."""
    import sympy

    from autograder import remote_sympy
    p = Pair(student("import sympy\n"
                     "B, D, F = sympy.symbols('B D F', positive=True)\n"
                     "def intensity():\n"
                     "    return sympy.simplify(2 * B * D * F / (2 * B * D + 2 * D * F + 2 * B * F))\n"
                     "def limit():\n"
                     "    return sympy.limit(B * sympy.Symbol('c') / (B + 1), B, sympy.oo)\n"
                     "def mine():\n"
                     "    return sympy.Function('f')(B)\n"
                     "def bomb():\n"
                     "    return sympy.Pow(10, 10**9, evaluate=False)\n"))
    ns = p.run("import sympy\nB, D, F = sympy.symbols('B D F', positive=True)\n"
               "i = intensity()\nlim = limit()\nsame = sympy.simplify(i - B * D * F / "
               "(B * D + D * F + B * F)) == 0")
    assert ns["same"] and ns["lim"] == sympy.Symbol("c")
    with pytest.raises(remote.StudentError, match="SymPy f cannot be sent"):
        p.run("mine()")                      # refused by the kernel's side, said to the tester
    with pytest.raises(remote.ProtocolError, match="power over"):
        p.run("bomb()")                      # refused by the tester before it evaluates
    p.close()
    with pytest.raises(ValueError, match="unknown assumptions"):
        remote_sympy.decode(["Symbol", "x", {"__class__": True}], ValueError)
    with pytest.raises(ValueError, match="accept"):
        remote_sympy.decode(["eval", "1"], ValueError)


def test_the_students_objects_stay_in_its_kernel():
    p = Pair(student("class Cache:\n"
                     "    def __init__(self, n):\n        self.k = torch.zeros(n)\n"
                     "        self.items = []\n"
                     "    def add(self, v):\n        self.items.append(v)\n"
                     "        return len(self.items)\n"))
    ns = p.run("c = Cache(4)\nn = c.add(3)\nn = c.add(5)\nk = c.k\nitems = c.items\n"
               "size = len(c.items)\nr = repr(c)")
    assert ns["n"] == 2 and ns["items"] == [3, 5] and ns["size"] == 2
    assert torch.equal(ns["k"], torch.zeros(4)) and "Cache object" in ns["r"]
    p.close()


def test_a_tensor_from_the_kernel_carries_its_address_there():
    """autograder.data_ptr: a test checks "a view, not a copy" and "allocated once" on the
    addresses the kernel's tensors had there (lab 02's cache test); the tester's copies live
    elsewhere. A tensor the tester made itself answers its own data_ptr()."""
    p = Pair(student("class Buf:\n"
                     "    def __init__(self):\n        self.k = torch.zeros(4, 3)\n"
                     "    def view(self, n):\n        return self.k[:n]\n"
                     "    def copy(self, n):\n        return self.k[:n].clone()\n"))
    ns = p.run("import autograder as ag\nb = Buf()\nk = b.k\n"
               "same = ag.data_ptr(b.view(2)) == ag.data_ptr(k)\n"
               "copied = ag.data_ptr(b.copy(2)) == ag.data_ptr(k)\n"
               "again = ag.data_ptr(b.k) == ag.data_ptr(k)\n"
               "here = torch.ones(2)\nown = ag.data_ptr(here) == here.data_ptr()")
    assert ns["same"] and ns["again"] and ns["own"]
    assert not ns["copied"]
    assert ns["k"].data_ptr() != ag_address(ns["k"])    # a copy, which knows where it came from
    p.close()


def ag_address(t):
    from autograder.checks import KERNEL_ADDRESS
    return getattr(t, KERNEL_ADDRESS)


def _tiny(**kw):
    from minillm.config import ModelConfig
    from minillm.model import Transformer
    torch.manual_seed(0)
    return Transformer(ModelConfig(vocab_size=31, dim=16, n_layers=4, n_heads=2, head_dim=8,
                                   hidden_dim=24, max_seq_len=32, **kw)).eval()


def test_a_lab_that_copies_modules_sends_the_whole_model():
    """remote_objects: in a "copy" lab the student's code gets the model itself (layers,
    windows, weights, shared parts shared again), runs it there, and returns its own objects
    as handles; configs and specs come back by value."""
    from minillm.attention import to_cla, to_sliding
    from minillm.kvcache import KVSpec, layer_specs
    p = Pair(student("from minillm.kvcache import layer_specs\n"
                     "def look(m):\n"
                     "    tied = m.lm_head.weight is m.embed_tokens.weight\n"
                     "    shared = [id(l.self_attn.shared) for l in m.layers"
                     " if hasattr(l.self_attn, 'shared')]\n"
                     "    return [tied, len(set(shared)), [l.self_attn.window for l in m.layers],"
                     " type(m).__name__]\n"
                     "def run(m, ids):\n    with torch.no_grad():\n        return m(ids)\n"
                     "def half(m):\n    import copy\n    m2 = copy.deepcopy(m)\n"
                     "    m2.layers = m2.layers[:2]\n    return m2\n"), copy_modules=True)
    model = to_cla(_tiny(tie_embeddings=True), 2)
    hybrid = to_sliding(_tiny(), 5, global_every=2)
    ids = torch.randint(0, 31, (2, 9), generator=torch.Generator().manual_seed(1))
    p.ns.update(model=model, hybrid=hybrid, ids=ids, layer_specs=layer_specs)
    ns = p.run("seen = look(model)\nout = run(model, ids)\nh = half(hybrid)\n"
               "cfg = h.config\nspecs = layer_specs(h)\nfirst = next(h.parameters())\n"
               "windows = look(hybrid)[2]")
    assert ns["seen"] == [True, 2, [None] * 4, "Transformer"] and ns["windows"] == [5, None] * 2
    with torch.no_grad():
        assert torch.allclose(ns["out"], model(ids), atol=1e-6)
    assert isinstance(ns["h"], remote.Remote) and ns["cfg"] == hybrid.config
    assert ns["specs"] == layer_specs(hybrid)[:2] and all(type(s) is KVSpec for s in ns["specs"])
    assert torch.equal(ns["first"], next(hybrid.parameters()))
    p.close()


def test_a_copied_model_changed_in_place_comes_back_or_fails():
    """New weight values come back into the tester's parameters; a replaced layer cannot come
    back, and the call fails saying so."""
    p = Pair(student("def scale(m):\n    with torch.no_grad():\n"
                     "        m.layers[0].self_attn.k_proj.weight.mul_(2)\n"
                     "def swap(m):\n    m.layers[1].self_attn.k_proj = torch.nn.Linear(16, 16)\n"
                     "def rename(m):\n    m.config = None\n"), copy_modules=True)
    model = _tiny()
    before = model.layers[0].self_attn.k_proj.weight.clone()
    p.ns["model"] = model
    p.run("scale(model)")
    assert torch.equal(model.layers[0].self_attn.k_proj.weight, 2 * before)
    for call in ("swap(model)", "rename(model)"):
        with pytest.raises(ValueError, match="changed the (Attention|Transformer) it was given"):
            p.run(call)
    p.close()


def test_a_counted_model_crosses_as_a_stand_in_even_in_a_copy_lab():
    """A model a WorkCounter counts runs its passes in the tester (lab 05's work test); the
    same model uncounted crosses whole."""
    p = Pair(student("from minillm.kvcache import KVCache\n"
                     "def kind(m):\n    return [type(m).__name__, sum(p.numel() for p in m.parameters()) > 0,"
                     " KVCache.for_model(m, 1, 4).nbytes]\n"
                     "def run(m, ids):\n    return m(ids)\n"), copy_modules=True)
    p.ns["model"], p.ns["ids"] = _tiny(), torch.tensor([[1, 2, 3]])
    ns = p.run("import autograder as ag\nwhole = kind(model)\n"
               "with ag.WorkCounter(model) as w:\n    seen = kind(model)\n    out = run(model, ids)\n"
               "after = kind(model)")
    nbytes = 4 * 2 * 4 * 2 * 8 * 4              # 4 layers, K and V, 4 positions, 2 heads of 8
    assert ns["whole"] == ns["after"] == ["Transformer", True, nbytes]
    assert ns["seen"] == ["StandIn", False, nbytes], "no weights, but layers that shape a cache"
    assert (ns["w"].calls, ns["w"].tokens) == (1, 3)
    p.close()


def test_the_tester_differentiates_through_the_students_function():
    """remote_autograd: a call whose tensors require gradients is a node of the tester's graph;
    its backward asks the kernel for the gradients of the student's graph. The same gradients
    as one process, through a tuple result, a list argument, and into the tester's own graph
    (logits of the tester's model -> the student's loss -> the model's weights)."""
    src = ("import torch.nn.functional as F\n"
           "def kl(s, t, tau=1.0):\n"
           "    return F.kl_div(F.log_softmax(s / tau, -1), F.log_softmax(t / tau, -1),"
           " reduction='batchmean', log_target=True) * tau ** 2\n"
           "def two(xs):\n    return xs[0] * xs[1], (xs[0] ** 2).sum()\n"
           "def counts(x):\n    return (x > 0).sum()\n"
           "def name(x):\n    return 'plain'\n")
    p = Pair(student(src))
    local = student(src)
    g = torch.Generator().manual_seed(3)
    s, t = torch.randn(4, 7, generator=g), torch.randn(4, 7, generator=g)
    a, b = torch.randn(5, generator=g), torch.randn(5, generator=g)
    model = _tiny()
    ids = torch.randint(0, 31, (2, 6), generator=g)
    p.ns.update(s=s, t=t, a=a, b=b, model=model, ids=ids)
    ns = p.run("w = s.clone().requires_grad_(True)\nloss = kl(w, t, 2.0)\nloss.backward()\n"
               "x, y = a.clone().requires_grad_(True), b.clone().requires_grad_(True)\n"
               "prod, sq = two([x, y])\n(prod.sum() + 3 * sq).backward()\n"
               "n = counts(x)\nlabel = name(x)\n"
               "gs = torch.autograd.grad(kl(model(ids), model(ids).detach() + 1), "
               "list(model.parameters()), allow_unused=True)\n"
               "with torch.no_grad():\n    quiet = kl(w, t)\n")
    w0 = s.clone().requires_grad_(True)
    loss0 = local["kl"](w0, t, 2.0)
    loss0.backward()
    assert torch.allclose(ns["loss"].detach(), loss0.detach()) and ns["loss"].requires_grad
    assert torch.allclose(ns["w"].grad, w0.grad, atol=1e-7)
    x0, y0 = a.clone().requires_grad_(True), b.clone().requires_grad_(True)
    prod0, sq0 = local["two"]([x0, y0])
    (prod0.sum() + 3 * sq0).backward()
    assert torch.allclose(ns["x"].grad, x0.grad) and torch.allclose(ns["y"].grad, y0.grad)
    assert int(ns["n"]) == int((a > 0).sum()) and ns["label"] == "plain"
    gs0 = torch.autograd.grad(local["kl"](model(ids), model(ids).detach() + 1),
                              list(model.parameters()), allow_unused=True)
    assert all(torch.allclose(u, v, atol=1e-6) for u, v in zip(ns["gs"], gs0))
    assert not ns["quiet"].requires_grad, "grad mode off: a plain call"
    p.close()


def test_a_gradient_the_kernel_forges_is_refused_by_shape():
    """The kernel's answer to a backward is checked: gradients of the wrong shape fail."""
    p = Pair(student("class Bad(torch.autograd.Function):\n"
                     "    @staticmethod\n    def forward(ctx, x):\n        return x.sum()\n"
                     "    @staticmethod\n    def backward(ctx, g):\n        return g.expand(2)\n"
                     "def f(x):\n    return Bad.apply(x)\n"))
    with pytest.raises(RuntimeError):
        p.run("x = torch.ones(3, requires_grad=True)\nf(x).backward()")
    p.close()


def test_a_copied_model_trained_by_the_student_comes_back_with_its_gradients():
    """Lab 08's distillation step in a "copy" lab: the student's step trains the copy of the
    tester's model; its new weights and gradients come back, a gradient the tester's model held
    crosses with it (so a step that forgets to zero it accumulates, as in one process), and a
    teacher the step differentiated through comes back with gradients too."""
    from autograder.labs.lab08_pruning import SGD
    src = ("def step(m, teacher, ids, opt, zero=True):\n"
           "    if zero:\n        opt.zero_grad()\n"
           "    loss = (m(ids) - teacher(ids)).pow(2).mean()\n"
           "    loss.backward()\n    opt.step()\n    return loss.item()\n")
    p = Pair(student(src), copy_modules=True)
    local = student(src)
    import copy
    m, teacher = _tiny(), _tiny()
    with torch.no_grad():
        for q in teacher.parameters():
            q.mul_(1.5)
    ids = torch.randint(0, 31, (2, 6), generator=torch.Generator().manual_seed(2))
    m0, teacher0 = copy.deepcopy(m), copy.deepcopy(teacher)
    opt, opt0 = SGD(m.parameters(), lr=0.1), SGD(m0.parameters(), lr=0.1)
    p.ns.update(m=m, teacher=teacher, ids=ids, opt=opt)
    ns = p.run("l1 = step(m, teacher, ids, opt)\nl2 = step(m, teacher, ids, opt, zero=False)\n")
    l1 = local["step"](m0, teacher0, ids, opt0)
    l2 = local["step"](m0, teacher0, ids, opt0, zero=False)
    assert ns["l1"] == pytest.approx(l1, rel=1e-5) and ns["l2"] == pytest.approx(l2, rel=1e-5)
    for (k, q), q0 in zip(m.named_parameters(), m0.parameters()):
        assert torch.allclose(q, q0, atol=1e-6), k
        assert q.grad is not None and torch.allclose(q.grad, q0.grad, atol=1e-6), k
    assert all(q.grad is not None for q in teacher.parameters()), "the teacher's gradients"
    p.close()


def test_the_kernel_cannot_ask_the_tester_to_bind_launch_or_differentiate():
    """The requests that only the tester may make ("bind" a name, run a "course" function,
    "grad" a graph, "gcall"), sent by the student's side while it serves a call, are refused
    there: nothing is bound, run or differentiated in the tester."""
    ns: dict = {}
    p = Pair(ns)
    ran = []
    p.ns["spy"] = lambda *a: ran.append(a)
    tried = []

    def evil(callback):
        for op, args in [("bind", ("planted", 1)),
                         ("course", ("autograder.labs.kernelcheck._launch_there", (), {})),
                         ("grad", ([None],)), ("gcall", ((), {}, ()))]:
            try:
                p.student.request(op, callback._id if op in ("grad", "gcall") else None, *args)
            except Exception as e:            # noqa: BLE001 - each must be refused
                tried.append((op, type(e).__name__))
        return "done"
    ns["evil"] = evil
    p.ns.student_names = frozenset(ns)
    assert p.run("out = evil(spy)")["out"] == "done"
    assert [op for op, _ in tried] == ["bind", "course", "grad", "gcall"], tried
    assert "planted" not in p.ns and not ran, (tried, ran)
    p.close()


def test_a_shared_object_stays_in_the_tester_and_offers_its_methods_only():
    """remote.shared: lab 05's loop hands the student's step its cache and drafter as handles
    on the tester's own objects: the kernel may call their public methods, read nothing else;
    a shared model is a stand-in. Without a tester, shared(x) is x."""
    from minillm.kvcache import KVCache
    p = Pair(student("def step(m, cache, ids):\n"
                     "    out = m(ids, cache=cache)\n"
                     "    cache.truncate(1)\n"
                     "    return out.shape[1]\n"
                     "def peek(cache, what):\n    return getattr(cache, what)\n"))
    model = _tiny()
    cache = KVCache.for_model(model, 1, 8)
    remote.CURRENT = p.ns.endpoint
    try:
        p.ns.update(model=model, cache=cache, shared=remote.shared)
        ns = p.run("n = step(shared(model), shared(cache), torch.tensor([[1, 2, 3]]))")
        assert ns["n"] == 3 and cache.seq_len == 1, "the step ran on the tester's own cache"
        for what in ("seq_len", "k", "_start"):
            with pytest.raises((remote.StudentError, AttributeError)):
                p.run(f"peek(shared(cache), {what!r})")
    finally:
        remote.CURRENT = None
    assert remote.shared(cache) is cache
    p.close()


def test_only_the_solution_names_are_read_from_the_kernel():
    p = Pair(student("def f(x):\n    return x\nhelper = 3\n"))
    p.ns.student_names = frozenset({"f"})
    assert p.run("y = f(2)")["y"] == 2
    with pytest.raises(NameError):
        p.run("helper")
    p.run("z = len([1, 2])")             # a builtin is never looked up in the kernel
    assert p.ns["z"] == 2
    p.close()


def test_the_reference_guard_is_switched_on_in_the_kernel(monkeypatch):
    """`reference_disabled` in the tester disables the reference for the student's calls."""
    p = Pair(student("import minillm.sampling\n"
                     "def t(x, temp):\n"
                     "    return minillm.sampling.apply_temperature(x, temp)\n"))
    import autograder
    from autograder import tester
    autograder.bind()
    for name, module in list(sys.modules.items()):      # the tester's patches, undone after
        for attr in ("ReferenceGuard", "reference_disabled"):
            if name.split(".")[0] == "autograder" and hasattr(module, attr):
                monkeypatch.setattr(module, attr, getattr(module, attr))
    tester._forward_reference_guard(p.ns)
    p.ns["ag"] = autograder
    assert torch.equal(p.run("y = t(torch.ones(2), 2.0)")["y"], torch.full((2,), 0.5))
    with pytest.raises(AssertionError, match="disabled during grading"):
        p.run("with ag.reference_disabled('minillm.sampling.apply_temperature'):\n"
              "    t(torch.ones(2), 2.0)")
    # the speed checks' guard, made once and entered around each call, forwards too
    from autograder import checks
    p.ns["guard"] = checks.ReferenceGuard("minillm.sampling.apply_temperature")
    for _ in range(2):
        with pytest.raises(AssertionError, match="disabled during grading"):
            p.run("with guard:\n    t(torch.ones(2), 2.0)")
    assert torch.equal(p.run("y = t(torch.ones(2), 4.0)")["y"], torch.full((2,), 0.25))
    p.close()


def test_the_plan_reads_only_what_the_unlocked_cells_bind():
    """tester_plan: the names of the solution and free cells, never their imports or a locked
    cell's names; a notebook without the metadata runs its tests in the kernel."""
    from nbformat.v4 import new_code_cell, new_notebook

    from autograder.tester_plan import tester_plan

    def cell(src, **role):
        return new_code_cell(src, metadata={"nbgrader": role} if role else {})
    nb = new_notebook(cells=[
        cell("import torch\nmodel = 1", locked=True, grade_id="s"),
        cell("import numpy as np\nfrom math import sqrt\ndef scale(x):\n    return x",
             solution=True, grade_id="a"),
        cell("measured = scale(2)\nfor i in range(3):\n    pass")])
    assert tester_plan(nb) is None
    nb.metadata["autograder"] = {"tests": "tester"}
    assert tester_plan(nb) == {"names": ["i", "measured", "scale"], "rebound": {},
                               "modules": "stand-in", "handed": {}, "kernel_only": []}
    # a name a locked test cell binds (it runs in the tester) and a free cell binds again later
    # (in the kernel): a later test that reads it reads the kernel's, as in one kernel (lab 01's
    # `intensity`, a SymPy expression in one test, the measured list after)
    nb.cells += [cell("intensity = 3\nassert measured == 2", locked=True, grade=True,
                      grade_id="t1"),
                 cell("intensity = [1.0, 2.0]"),
                 cell("assert intensity == [1.0, 2.0]\nmodel", locked=True, grade=True,
                      grade_id="t2"),
                 cell("intensity = 5", locked=True, grade=True, grade_id="t3"),
                 cell("assert intensity == 5", locked=True, grade=True, grade_id="t4")]
    assert tester_plan(nb)["rebound"] == {"t2": ["intensity"]}
    assert tester_plan(nb)["handed"] == {}, "every later read is of the kernel's own binding"
    # a name a test's visible part binds that a later kernel cell reads is handed over after
    # the test (lab 08's calibration batches); never one its hidden part binds or rebinds,
    # nor one a kernel cell binds itself before reading it
    nb.cells += [cell("calib = [1, 2]\nshown = 3\nalso = 4\n### BEGIN HIDDEN TESTS\n"
                      "shown = 5\n_secret = 6\n### END HIDDEN TESTS", locked=True, grade=True,
                      grade_id="t5"),
                 cell("also = 1\nprint(shown, _secret, also)"),
                 cell("calib = 7", locked=True, grade=True, grade_id="t6"),
                 cell("def f():\n    return calib")]
    assert tester_plan(nb)["handed"] == {"t6": ["calib"]}
    nb.cells.insert(-2, cell("print(calib)", locked=True, grade_id="s2"))   # a setup cell reads
    assert tester_plan(nb)["handed"] == {"t5": ["calib"], "t6": ["calib"]}
    assert tester_plan(nb)["kernel_only"] == []


def test_a_locked_cell_that_calls_the_students_code_runs_in_the_kernel_only():
    """tester_plan "kernel_only": a locked cell that is not a test runs in the tester too,
    unless it calls the student's code (lab 07's simulation and block map) or its metadata
    says so (lab 07's BlockPool, whose objects the student's code changes in place): then it
    runs in the kernel only, and the tests read what it binds from the kernel. One that only
    defines functions calling the student's code runs in both."""
    from nbformat.v4 import new_code_cell, new_notebook

    from autograder.tester_plan import tester_plan

    def cell(src, **role):
        return new_code_cell(src, metadata={"nbgrader": role} if role else {})
    pool = cell("class Pool:\n    pass", locked=True, grade_id="pool")
    pool.metadata["autograder"] = {"runs": "kernel"}
    nb = new_notebook(cells=[
        cell("import math\nbase = 1", locked=True, grade_id="setup"),
        cell("def allocate(p, n):\n    return n", solution=True, grade_id="a"),
        pool,
        cell("def check(p):\n    return allocate(p, 2)", locked=True, grade_id="helpers"),
        cell("import numpy as np\nused = allocate(Pool(), 3)\nprint(math.pi)", locked=True,
             grade_id="demo"),
        cell("assert check(Pool()) == 2 and used == 3", locked=True, grade=True,
             grade_id="t")])
    nb.metadata["autograder"] = {"tests": "tester"}
    plan = tester_plan(nb)
    assert plan["kernel_only"] == ["pool", "demo"]
    assert plan["names"] == ["Pool", "allocate", "used"], "read from the kernel, imports not"


@pytest.mark.parametrize("message", [
    {"ok": {"t": ["float32", [1000], 0, "cpu", 0]}},           # 4 bytes for 1000 floats
    {"ok": {"t": ["object", [1], 0, "cpu", 0]}},               # no such dtype
    {"ok": {"t": ["float32", [1], 0, "cpu", "here"]}},         # an address that is no int
    {"ok": {"t": ["float32", [1], 0, "cpu"]}},                 # no address
    {"ok": {"M": ["torch.nn", "Linear", True, [], [], [], [], []]}},   # a module: never
    {"ok": {"or": 0}},
    {"ok": {"dc": ["minillm.kvcache", "torch.load", []]}},     # not a dataclass
    {"ok": {"dc": ["os", "system", []]}},
    {"ok": {"zz": 1}},                                          # no such tag
    {"ok": {"L": [{"L": []}] * 3, "x": 1}},                     # two keys
    {"err": ["ValueError", "x" * 100_000]},                     # a long message is cut
])
def test_a_forged_reply_is_refused_or_bounded(message):
    a, b = socket.socketpair()
    ep = remote.Endpoint(a, share_handles=False)

    def answer():
        wire._recv(b)
        wire._send(b, message, [b"\0\0\0\0"])

    th = threading.Thread(target=answer)
    th.start()
    with pytest.raises((remote.ProtocolError, ValueError)) as info:
        ep.request("lookup", None, "f")
    th.join()
    assert len(str(info.value)) <= remote.MAX_TEXT


def test_a_reply_that_is_not_json_or_too_big_is_refused():
    a, b = socket.socketpair()
    b.sendall(wire._HEADER.pack(5, 0) + b"{oops")
    with pytest.raises(remote.ProtocolError, match="not JSON"):
        wire._recv(a)
    b.sendall(wire._HEADER.pack(remote.MAX_MESSAGE + 1, 0))
    with pytest.raises(remote.ProtocolError, match="size limit"):
        wire._recv(a)


def test_the_tester_process_runs_setup_and_tests_against_a_serving_kernel(tmp_path):
    """The tester as the job process runs it: JSON lines on stdin / stdout, the student's end
    connecting to its socket."""
    sock = str(tmp_path / "t.sock")
    proc = subprocess.Popen([sys.executable, "-m", "autograder.tester", sock], cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})

    def ask(cmd):
        proc.stdin.write(json.dumps(cmd) + "\n")
        proc.stdin.flush()
        return json.loads(proc.stdout.readline())

    try:
        assert ask({"op": "setup", "grade_id": "s", "source": "import torch\nW = 3"})["ok"]
        for body, ok in [("def scale(x, t):\n    return x / t\n", True),
                         ("def scale(x, t):\n    return x * t\n", False)]:
            ns = student(body)
            while not os.path.exists(sock):
                pass
            cmd = {"op": "test", "grade_id": "t", "names": ["scale"], "timeout": 60,
                   "source": "y = scale(torch.ones(2) * W, 2.0)\nprint('got', y.tolist())\n"
                             "assert torch.equal(y, torch.full((2,), 1.5)), 'wrong'"}
            proc.stdin.write(json.dumps(cmd) + "\n")
            proc.stdin.flush()
            remote.serve(sock, ns)
            reply = json.loads(proc.stdout.readline())
            assert reply["ok"] is ok, reply
            assert reply["stdout"].startswith("got ")
            if not ok:
                assert (reply["ename"], reply["evalue"]) == ("AssertionError", "wrong")
        # the visible part failed: the kernel never connects, the job process says abort
        proc.stdin.write(json.dumps({"op": "test", "source": "1", "names": [],
                                     "timeout": 60}) + "\n" + json.dumps({"op": "abort"}) + "\n")
        proc.stdin.flush()
        reply = json.loads(proc.stdout.readline())
        assert not reply["ok"] and reply["ename"] == "NotRun"
        proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
        proc.stdin.flush()
        assert proc.wait(30) == 0
    finally:
        proc.kill()
