"""The graded lab's references are withheld from the student's kernel (autograder/withheld.py):
the kernel imports the course from a copy in which each declared definition is a stub that
names the lab and what the student writes; everything else works as installed."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograder.tester_plan import withheld_of
from autograder.withheld import build, stub_source

REPO = Path(__file__).resolve().parent.parent
LABS = sorted(p.name for p in (REPO / "labs").iterdir() if (p / f"{p.name}.ipynb").is_file())


def run_with(course: Path, code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(course)}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300, cwd=course)        # not the repository: its minillm/
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_a_withheld_function_raises_naming_the_lab_and_what_to_write(tmp_path):
    course, links = build({"minillm.sampling:top_p_filter": "top_p_filter",
                           "minillm.kvcache:KVCache": "StaticKVCache"}, "00_sampling",
                          tmp_path / "course")
    assert (REPO / "minillm" / "assets").resolve() in links
    out = run_with(course, """
import importlib, inspect, torch, minillm, minillm.sampling as s
from minillm.kvcache import KVCache
print(minillm.__file__)
print(s.top_k_filter(torch.tensor([1.0, 2.0]), 1).tolist())      # the rest works
print(type(minillm.load("target")).__name__)                     # the shipped weights load
from minillm.data import CORPUS_DIR
print("corpus:", CORPUS_DIR.is_dir())
for call in (lambda: s.top_p_filter(torch.zeros(3), 0.5), lambda: KVCache(None, 1, 8),
             lambda: importlib.reload(s).top_p_filter(torch.zeros(3), 0.5)):
    try:
        call()
    except NotImplementedError as e:
        print("withheld:", e)
print("source:", "cumsum" in inspect.getsource(s.top_p_filter))
class Mine(KVCache):                                              # still a class to subclass
    pass
print("subclass ok")
""")
    assert out.splitlines()[0].startswith(str(course))
    assert "[-inf, 2.0]" in out and "Transformer" in out and "subclass ok" in out
    assert "corpus: True" in out
    assert out.count("withheld: minillm.sampling.top_p_filter is the course's answer to lab "
                     "00_sampling") == 2, out
    assert "the grader runs your own StaticKVCache" in out and "source: False" in out


def test_a_declaration_that_names_nothing_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no such definition"):
        build({"minillm.sampling:nothing_here": "x"}, "00", tmp_path / "a")
    with pytest.raises(ValueError, match="do not exist"):
        build({"minillm.nowhere:f": "x"}, "00", tmp_path / "b")
    with pytest.raises(ValueError, match="module:qualname inside"):
        build({"torch.nn:Linear": "x"}, "00", tmp_path / "c")


def test_a_stub_keeps_the_signature_decorators_and_docstring():
    text = ('import functools\n\n\n@functools.lru_cache\ndef f(x, *, y=2):\n    """Doc."""\n'
            '    z = x + y\n    return z\n\n\nclass C:\n    k = 3\n\n    def m(self):\n'
            '        return 1\n')
    out = stub_source(text, {"f": "no", "C": "nope"}, "m")
    assert "@functools.lru_cache\ndef f(x, *, y=2):\n    \"\"\"Doc.\"\"\"\n    raise " \
           "NotImplementedError('no')" in out
    assert "    k = 3" in out and "        raise NotImplementedError('nope')" in out
    assert "return z" not in out and "return 1" not in out
    compile(out, "m", "exec")


@pytest.mark.parametrize("lab", LABS)
def test_every_labs_declaration_withholds_what_it_names(lab, tmp_path):
    """Each lab's source notebook declares its withheld references, and each one is a stub in
    the copy its kernel imports."""
    nb = nbformat.read(str(REPO / "labs" / lab / f"{lab}.ipynb"), as_version=4)
    withheld = withheld_of(nb)
    assert withheld, f"{lab} withholds nothing: delegating to the course would pass its tests"
    course, _ = build(withheld, lab, tmp_path / "course")
    targets = sorted(withheld)
    out = run_with(course, f"""
import importlib, inspect
for target in {targets!r}:
    module, _, qualname = target.partition(":")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    text = inspect.getsource(obj)
    print(target, "is withheld while" in text)
""")
    assert out.split() == [w for t in targets for w in (t, "True")], out


def test_lab01_explorer_runs_on_the_students_napkin_family(tmp_path):
    """Lab 01 withholds the napkin family although its explorer computes with it: in its kernel
    the explorer takes the student's functions (`formulas=`)."""
    lab = "01_roofline"
    nb = nbformat.read(str(REPO / "labs" / lab / f"{lab}.ipynb"), as_version=4)
    course, _ = build(withheld_of(nb), lab, tmp_path / "course")
    out = run_with(course, """
import minillm.roofline as rf
from minillm.explorers import napkin_explorer
for call in (lambda: rf.napkin("llama-2-13b", "h100", 1, 1000),
             lambda: rf.tensor_parallel_napkin("llama-2-13b", "h100", 1, 1000, 2),
             lambda: rf.max_batch_that_fits("llama-2-13b", "h100", 1000),
             lambda: rf.lecture_num_params("llama-2-13b"),
             lambda: rf.kv_cache_bytes_per_seq("llama-2-13b", 1000),
             lambda: rf.accelerator_intensity("h100"), lambda: napkin_explorer()):
    try:
        call()
    except NotImplementedError:
        print("withheld")
def napkin(B, S, model, gpu, bytes_per_param=2):
    kv, latency = 1e9, (B * 1e9 + 2e10) / gpu["bandwidth"]
    return {"params": 1e10, "param_bytes": 2e10, "kv_bytes_per_seq": kv, "latency_s": latency,
            "memory_bytes": B * kv + 2e10, "throughput_tok_s": B / latency, "fits": True}
def tensor_parallel(B, S, model, gpu, G, link_bandwidth, allreduce_latency_s=0, bytes_per_param=2):
    return {**napkin(B, S, model, gpu), "memory_per_gpu_bytes": 1.0, "comm_s": 0.0}
ex = napkin_explorer(formulas=dict(napkin=napkin, tensor_parallel=tensor_parallel,
                                   max_batch_that_fits=lambda S, model, gpu, bytes_per_param=2: 7,
                                   accelerator_intensity=lambda f, b: 42.0))
print("explorer", ex.state["error"], ex.state["max_batch"], ex.state["row"]["accelerator_intensity"])
print("split", ex.set(gpus=2)["error"], ex.state["row"]["memory_per_gpu_bytes"])
""")
    assert out.count("withheld") == 7 and "explorer None 7 42.0" in out and "split None 1.0" in out, out


def test_lab05_runs_its_measurements_on_the_students_formulas_and_lookup(tmp_path):
    """Lab 05 withholds the formulas and prompt_lookup although its bench, prompt-lookup timing
    and explorer use them: in its kernel those take the student's functions (the bench, in a
    process of its own, reports its measurements only)."""
    lab = "05_speculative"
    nb = nbformat.read(str(REPO / "labs" / lab / f"{lab}.ipynb"), as_version=4)
    course, _ = build(withheld_of(nb), lab, tmp_path / "course")
    out = run_with(course, """
import json, subprocess, sys
import minillm, minillm.speculative as s
from minillm.bench.speculative import bench_prompt_lookup, repetitive_prompt
from autograder.labs import lab05
from minillm.explorers import speculative_explorer
for call in (lambda: s.expected_tokens_per_step(0.5, 2), lambda: s.expected_speedup(0.5, 2, 0.1),
             lambda: s.prompt_lookup([1, 2, 1], 2)):
    try:
        call()
    except NotImplementedError:
        print("withheld")
print("default explorer:", speculative_explorer().state["error"])
ex = speculative_explorer(formulas={"expected_tokens_per_step": lambda a, k: 1.0,
                                    "expected_speedup": lambda a, k, c, v: 2.0})
print("explorer", ex.state["speedup"])
tok, target = minillm.load_tokenizer("target"), minillm.load("target")
mine = lambda context, k, ngram: context[-k:]
lk = bench_prompt_lookup(target, repetitive_prompt(tok), k=2, new_tokens=4, repeats=1,
                         lookup=mine)
print("lookup", lk["exact_greedy"])
args = lab05.bench_command()
args[args.index("compiled-int8")] = "packed"                   # no compiler here: same flags
args[args.index("--new-tokens") + 1], args[args.index("--k") + 1] = "4", "1"
run = subprocess.run([sys.executable, *args], capture_output=True, text=True)
print("bench", run.returncode, run.stderr[-2000:])
print("rows", [(r["drafter"], sorted(r)) for r in json.loads(run.stdout)["runs"]]
      if not run.returncode else None)
""")
    assert out.count("withheld") == 4 and "explorer 2.0" in out and "lookup True" in out, out
    assert "default explorer: your expected_tokens_per_step raised NotImplementedError" in out
    assert "bench 0" in out, out
    rows = out.split("rows ", 1)[1]
    assert "drafts_per_step" in rows and "predicted" not in rows, rows
    assert "prompt-lookup" not in rows, rows


def test_lab03_runs_its_mla_models_without_the_naive_step(tmp_path):
    """Lab 03 withholds MLAAttention.attend_naive although its cells run MLA models: their
    forward does not call it, and `to_mla(..., decode_step=)` runs the student's step."""
    lab = "03_shrinking_kv"
    nb = nbformat.read(str(REPO / "labs" / lab / f"{lab}.ipynb"), as_version=4)
    assert "minillm.attention.mla:MLAAttention.attend_naive" in withheld_of(nb)
    course, _ = build(withheld_of(nb), lab, tmp_path / "course")
    out = run_with(course, """
import torch
from autograder.labs import lab03
from minillm.attention import to_mla
from minillm.kvcache import KVCache
attn = lab03.mla_layer(24, 4, seed=0, config=dict(dim=48, n_heads=4, head_dim=16))
for path in (lab03.library_naive, lab03.library_absorbed):
    try:
        path(attn, *lab03.step_inputs(attn, 1, 5, 0))
    except NotImplementedError:
        print("withheld")
def mine(attn, q_nope, q_rope, c, k_rope):                 # a student's naive step
    B, S, _ = c.shape
    N, H, R = attn.n_heads, attn.head_dim, attn.rope_dim
    k = torch.cat([attn.k_up(c).view(B, S, N, H - R), k_rope[:, :, None].expand(B, S, N, R)], -1)
    q = torch.cat([q_nope, q_rope], -1)
    p = torch.softmax(torch.einsum("bnh,bsnh->bns", q, k) / H ** 0.5, -1)
    return torch.einsum("bns,bsnh->bnh", p, attn.v_up(c).view(B, S, N, H))
model = lab03.random_model(0, dict(vocab_size=50, dim=48, n_layers=2, n_heads=4, head_dim=16,
                                   hidden_dim=64, max_seq_len=32))
plain, yours = to_mla(model, 24, 4), to_mla(model, 24, 4, decode_step=mine)
ids = torch.randint(0, 50, (1, 10), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    full = plain(ids)
    cache = KVCache.for_model(yours, 1, 10)
    steps = [yours(ids[:, :4], cache=cache)]
    steps += [yours(ids[:, t:t + 1], cache=cache) for t in range(4, 10)]
print("agree", torch.allclose(torch.cat(steps, 1), full, atol=1e-5))
""")
    assert out.split() == ["withheld", "withheld", "agree", "True"], out


def test_lab02_counts_bytes_per_token_with_the_students_function(tmp_path):
    """Lab 02 withholds minillm.kvcache.kv_bytes_per_token although its bandwidth cell counts a
    step's bytes: there `step_bytes` takes the student's kv_bytes_per_token."""
    lab = "02_kv_cache"
    nb = nbformat.read(str(REPO / "labs" / lab / f"{lab}.ipynb"), as_version=4)
    course, _ = build(withheld_of(nb), lab, tmp_path / "course")
    out = run_with(course, """
import minillm
from minillm.bench.bandwidth import step_bytes
from minillm.decode import PackedDecoder
from minillm.kvcache import KVSpec, kv_bytes_per_token
packed = PackedDecoder(minillm.load("target"))
for call in (lambda: kv_bytes_per_token([KVSpec(1, 2, 2)]), lambda: step_bytes(packed, 4)):
    try:
        call()
    except NotImplementedError:
        print("withheld")
mine = lambda cfg, b: 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * b
print("kv", step_bytes(packed, 4, kv_per_token=mine)["kv_bytes"] == 5 * mine(packed.config, 4))
""")
    assert out.split() == ["withheld", "withheld", "kv", "True"], out


def test_lab06_trace_server_and_explorer_run_on_the_students_functions(tmp_path):
    """Lab 06 withholds its generators, `request_latencies` and `percentile` although its trace,
    server and explorer use them: the trace and the explorer's load summary take the student's,
    and the server records its latencies itself."""
    pytest.importorskip("fastapi")
    lab = "06_continuous_batching"
    nb = nbformat.read(str(REPO / "labs" / lab / f"{lab}.ipynb"), as_version=4)
    course, _ = build(withheld_of(nb), lab, tmp_path / "course")
    out = run_with(course, """
import minillm, minillm.data
from minillm.bench import load_gen
from minillm.serving import metrics
from minillm.serving.server import BackgroundServer
from minillm.serving.trace import make_trace
for call in (lambda: make_trace(4), lambda: metrics.percentile([1.0], 50),
             lambda: metrics.request_latencies(None),
             lambda: load_gen.summarize_load([load_gen.Record(0.0, first=0.1, chunks=[0.1, 0.2],
                                                              tokens=2)], load_gen.Workload())):
    try:
        call()
    except NotImplementedError:
        print("withheld")
trace = make_trace(3, arrivals=lambda n, rate, g: [1.0] * n,
                   lengths=lambda n, median, sigma, max_len, g: [2] * n)
print("trace", [(r.arrival_time, len(r.prompt_ids), r.max_new_tokens) for r in trace])
model, tok = minillm.load("target"), minillm.load_tokenizer("target")
w = load_gen.Workload(rate=100.0, num_requests=2, max_tokens=3)
with BackgroundServer(model, tok, "target", max_num_seqs=2) as srv:
    r = load_gen.load_test(srv.url, "target", w, minillm.data.load_tokens(tok, "val").tolist(),
                           percentile=lambda values, p: 7.0)
    print("served", r["completed"], r["ttft_p50_s"], srv.engine_loop.ttft.count,
          srv.engine_loop.tpot.count, srv.engine_loop.alive)
""")
    assert out.count("withheld") == 4, out
    assert "trace [(1.0, 2, 2), (1.0, 2, 2), (1.0, 2, 2)]" in out and "served 2 7.0 2 2 True" in out


def test_lab09_runs_the_hybrid_and_the_sampler_on_the_students_functions(tmp_path):
    """Lab 09 withholds the linear layer's chunked form and step and the diffusion sampler
    although its hybrid, recall models and diffusion measurements run them: in its kernel those
    run the student's (linear_attention.use_forms, diffusion.sample_with)."""
    lab = "09_beyond_attention"
    nb = nbformat.read(str(REPO / "labs" / lab / f"{lab}.ipynb"), as_version=4)
    course, _ = build(withheld_of(nb), lab, tmp_path / "course")
    out = run_with(course, """
import torch, minillm
from minillm import diffusion, linear_attention as la
from minillm.bench.decode_memory import decode_step_times
hybrid, dlm = minillm.load("hybrid"), minillm.load("diffusion")
ids = torch.tensor([[5, 6, 7, 8]])
for call in (lambda: hybrid(ids), lambda: diffusion.sample(dlm, [5, 6], 4, 2)):
    try:
        call()
    except NotImplementedError as e:
        print("withheld:", str(e).split(" is ")[0])
calls = []
def la_chunked(q, k, v, decay, chunk):           # stand-ins for the student's functions
    calls.append("chunked")
    return torch.zeros_like(q), (None, None)
def la_step(q, k, v, state, decay):
    calls.append("step")
    return torch.zeros_like(q), state
la.use_forms(hybrid, la_chunked, la_step)
print("forward", tuple(hybrid(ids).shape), calls.count("chunked"))
decode_step_times({"hybrid": hybrid}, [16], repeats=1, warmup=0)
print("decoded", calls.count("step") > 0)
def diffusion_sample(model, prompt, n_new, steps):
    model(torch.tensor([list(prompt) + [model.config.vocab_size - 1] * n_new]))
    return [7] * n_new
print("sampled", diffusion.sample_with(diffusion_sample, dlm, [5, 6], 8, 4, temperature=0.7,
                                       block=4))
""")
    assert "withheld: minillm.linear_attention.chunked" in out, out
    assert "withheld: minillm.diffusion.sample" in out, out
    assert "forward (1, 4, 4096) 7" in out and "decoded True" in out, out
    assert "sampled ([7, 7, 7, 7, 7, 7, 7, 7], 2)" in out, out


def test_lab04_builds_its_quantized_models_with_the_students_formats(tmp_path):
    """Lab 04 withholds kernels.formats' quantizers and int4 packing (its student writes them)
    although its cells build QuantLinear models and run bench_quant: in its kernel those take
    the student's functions (`formats=`), and the Triton probes draw their int4 codes as bytes."""
    lab = "04_quantization"
    nb = nbformat.read(str(REPO / "labs" / lab / f"{lab}.ipynb"), as_version=4)
    course, _ = build(withheld_of(nb), lab, tmp_path / "course")
    out = run_with(course, """
import torch, torch.nn as nn
import kernels
from kernels import formats as f
from autograder.labs import lab04_triton as tri
from minillm import quant
from minillm.config import ModelConfig
from minillm.model import Transformer
from minillm.bench.quant import bench_quant
w, c = torch.randn(32, 128), torch.zeros(2, 4, dtype=torch.uint8)
for call in (lambda: f.absmax_quantize(w), lambda: f.zeropoint_quantize(w),
             lambda: f._zeropoint(w, 4, True), lambda: f.group_quantize(w, 64, 3),
             lambda: f.group_quantize_int4(w), lambda: f.pack_int4(c), lambda: f.unpack_int4(c),
             lambda: f.dequantize(c, torch.ones(2, 1)), lambda: kernels.quantize_w4(w),
             lambda: quant.QuantLinear.from_linear(nn.Linear(128, 32), 4)):
    try:
        call()
    except NotImplementedError:
        print("withheld")
def absmax(w):                                             # a student's functions
    s = w.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 127
    return torch.round(w / s).clamp(-127, 127).to(torch.int8), s
def groups(w, G):
    N, K = w.shape
    g = w.float().reshape(N, K // G, G)
    lo, hi = g.amin(-1, keepdim=True).clamp(max=0), g.amax(-1, keepdim=True).clamp(min=0)
    s = (hi - lo).clamp(min=1e-12) / 15
    z = torch.round(-lo / s)
    q = (torch.round(g / s) + z).clamp(0, 15).to(torch.uint8)
    return q.reshape(N, K), s[..., 0], z[..., 0]
def pack(codes):
    return codes[:, 0::2] | (codes[:, 1::2] << 4)
def unpack(p):
    return torch.stack([p & 15, p >> 4], -1).reshape(p.shape[0], -1)
def deq(codes, s, z, G):
    N, K = codes.shape
    return ((codes.float().reshape(N, K // G, G) - z[..., None]) * s[..., None]).reshape(N, K)
torch.manual_seed(0)
m = Transformer(ModelConfig(vocab_size=96, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                            hidden_dim=128, max_seq_len=64)).eval()
r = bench_quant(m, list(range(1, 9)), new_tokens=3, repeats=1, compiled=False,
                formats=quant.Formats(absmax, groups, pack, unpack, deq))
print("bench", r["int4_tok_s"] > 0, r["int8_tok_s"] > 0)
ins = tri.case_inputs("w4a16_gemv", tri.CASES["w4a16_gemv"][0], 1, fence=True)
print("probes", len(ins), len(tri._speed_inputs("w4a16", 32, 256, 128, "cpu")[0]))
""")
    assert out.split() == ["withheld"] * 10 + ["bench", "True", "True", "probes", "4", "4"], out


def test_lab08_a_plan_cannot_delegate_to_the_graders_own_plan(tmp_path):
    """The trick: a pruning plan that returns the course's plan. The grading module that the
    kernel imports holds no plan of its own (it calls `pruning.width_plan` in the tester), and in
    the kernel `pruning.width_plan` is the lab's stub."""
    nb = nbformat.read(str(REPO / "labs" / "08_pruning_distillation" /
                           "08_pruning_distillation.ipynb"), as_version=4)
    course, _ = build(withheld_of(nb), "08_pruning_distillation", tmp_path / "course")
    out = run_with(course, """
import autograder.labs.lab08 as lab08
from minillm import pruning
print("plans in the grading module:", sorted(n for n in vars(lab08) if "plan" in n.lower()))
try:
    pruning.width_plan(None, None, 0)
except NotImplementedError as e:
    print("withheld:", e)
""")
    assert "plans in the grading module: ['PLAN_MARGIN', 'PLAN_TOKENS', 'check_plan', 'plan_of']" \
        in out, out
    assert "withheld: minillm.pruning.width_plan is the course's answer to lab " \
           "08_pruning_distillation" in out, out


def test_lab11_withholds_the_split_and_keeps_the_launcher(tmp_path):
    """Lab 11 withholds the course's split (shard, shard_plan, the column- and row-parallel
    layers); the ranks' launcher and all_reduce_sum stay, since the student's split and the lab's
    measurements run in them."""
    lab = "11_sharding"
    nb = nbformat.read(str(REPO / "labs" / lab / f"{lab}.ipynb"), as_version=4)
    course, _ = build(withheld_of(nb), lab, tmp_path / "course")
    out = run_with(course, """
import torch, minillm
import torch.distributed as dist
from minillm.parallel import (ColumnParallelLinear, RowParallelLinear, all_reduce_sum, run_ranks,
                              shard, shard_plan)
target = minillm.load("target")
for call in (lambda: shard(target, 0, 2), lambda: shard_plan(target.config, 2, 0),
             lambda: ColumnParallelLinear.from_full(torch.nn.Linear(4, 4), 0, 2),
             lambda: RowParallelLinear(2, 4).forward(torch.ones(2))):
    try:
        call()
    except NotImplementedError as e:
        print("withheld:", str(e).split(" is ")[0])
def summed(rank, world):
    return all_reduce_sum(torch.full((2,), float(rank + 1))).tolist()
print("ranks", run_ranks(summed, 2, start="fork"))
""")
    for name in ("shard", "shard_plan", "ColumnParallelLinear", "RowParallelLinear"):
        assert f"withheld: minillm.parallel.shard.{name}" in out, out
    assert "ranks [[3.0, 3.0], [3.0, 3.0]]" in out, out
