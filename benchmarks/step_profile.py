"""Where the time of one compiled batch-1 decode step goes, per weight format.

    .venv/bin/python benchmarks/step_profile.py [--format int4] [--context 160] [--calls 100]

Builds the shipped target in the format (`minillm.bench.quant.model_formats`), compiles its step
(`minillm.decode.compiled.CompiledDecoder`), prefills a cache to `--context` positions and runs
the compiled step `--calls` times at the next position under torch.profiler, with Inductor's
generated kernels named in the profile (`cpp.enable_kernel_profile`). Prints microseconds per
step in five parts:

* `extern kernels`: aten ops the generated code calls (torch's int4 kernel, with the output
  buffers allocated for it);
* `generated kernels`: the C++ loops Inductor wrote (norms, RoPE, attention, the products it
  generates: for fp32, bf16 and int8 the whole step, products included, is a single kernel);
* `wrapper (Python)`: the generated Python function that calls those kernels, allocates their
  outputs and returns (the profiler's self time of the compiled graph's call);
* `guards`: Dynamo's check that the cached graph still applies (its cache lookup);
* `other`: the rest of the profiled time.

The profiler adds its own cost to every op it records, so the parts are larger than in an
unprofiled step; compare them with each other. Its figures feed benchmarks/RESULTS.md, "Decode on
the bandwidth scale (issue 20, CPU)" and "Quantized decode on the CPU (issue 19, lab 04)".
"""
from __future__ import annotations

import argparse
import json

import torch
import torch._inductor.config as inductor_config
from torch.profiler import ProfilerActivity, profile

import minillm
from minillm.bench.quant import FORMATS, model_formats
from minillm.decode.compiled import CompiledDecoder
from minillm.kvcache import KVCache


def parts(events, calls: int) -> dict:
    out = {"extern kernels": 0.0, "generated kernels": 0.0, "wrapper (Python)": 0.0,
           "guards": 0.0, "other": 0.0}
    for e in events:
        us = e.self_cpu_time_total / calls
        if e.key.startswith("graph_") and "cpp_fused" in e.key:
            out["generated kernels"] += us
        elif e.key.startswith("## Call CompiledFxGraph"):
            out["wrapper (Python)"] += us
        elif e.key == "TorchDynamo Cache Lookup":
            out["guards"] += us
        elif e.key.startswith(("aten::_weight", "aten::mv", "aten::addmv", "aten::mm",
                               "quantized::", "mkl", "aten::empty")):
            out["extern kernels"] += us
        else:
            out["other"] += us
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--format", choices=FORMATS, default="int4")
    ap.add_argument("--context", type=int, default=160)
    ap.add_argument("--calls", type=int, default=100)
    a = ap.parse_args()
    torch.set_num_threads(1)
    inductor_config.cpp.enable_kernel_profile = True
    model = model_formats(minillm.load("target"))[a.format]
    dec = CompiledDecoder(model)
    prompt = torch.randint(1, model.config.vocab_size, (1, a.context),
                           generator=torch.Generator().manual_seed(0))
    cache = KVCache.for_model(model, 1, a.context + 1)
    with torch.no_grad():
        model(prompt, cache=cache)
        for p in (a.context - 1, a.context):    # a static graph, then the dynamic one
            args = (prompt[0, -1:], p, dec.cos[p], dec.sin_signed[p], cache.k, cache.v)
            dec._compiled(*args)
        args = (prompt[0, -1:], a.context, dec.cos[a.context], dec.sin_signed[a.context],
                cache.k, cache.v)
        for _ in range(3):
            dec._compiled(*args)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(a.calls):
                dec._compiled(*args)
    us = parts(prof.key_averages(), a.calls)
    total = sum(us.values())
    print(json.dumps({"format": a.format, "context": a.context, "calls": a.calls,
                      "us_per_step": {k: round(v, 1) for k, v in us.items()},
                      "share": {k: round(v / total, 3) for k, v in us.items()}}, indent=1))


if __name__ == "__main__":
    main()
