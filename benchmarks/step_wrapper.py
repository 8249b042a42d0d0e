"""What the wrapper around a compiled decode step's generated code costs, per weight format.

    .venv/bin/python benchmarks/step_wrapper.py [--formats fp32,bf16,int8,int4] [--repeats 7]

Inductor's Python wrapper checks, by default, the size, stride and alignment of every tensor it
is given before it calls the generated code; the compiled step is given ~60 (every weight matrix,
norm and cache). `minillm.decode.compiled.INDUCTOR_OPTIONS` turns those asserts off, since
Dynamo's guards have already checked the same tensors. Inductor's C++ wrapper (`cpp_wrapper`)
would call the generated code, and the int4 step's 24 calls of torch's int4 kernel, without
Python in between; the step does not use it (its compile is much longer). For each
format this builds three `CompiledDecoder`s of the shipped target, with Inductor's default
wrapper ("asserts"), with `INDUCTOR_OPTIONS` ("no asserts") and with `INDUCTOR_OPTIONS` plus the
C++ wrapper ("C++ wrapper"), and times 255 greedy decode steps of each from the same prefilled
32-token prompt (`minillm.decode_speed.decode_steps`), interleaved, in CPU seconds on one thread,
with a read of one step's bytes per step beside them. Prints tokens/s, the fraction of the read
limit and each variant's speed-up over the default wrapper.
"""
from __future__ import annotations

import argparse

import torch

import minillm
from minillm.bandwidth import reader, step_bytes
from minillm.decode import PackedDecoder
from minillm.decode import compiled as compiled_decode
from minillm.decode_speed import decode_steps
from minillm.quant_speed import FORMATS, model_formats
from minillm.timing import cpu_time_interleaved, median

STEPS, PROMPT = 255, 32


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    formats = args.formats.split(",")
    if unknown := set(formats) - set(FORMATS):
        ap.error(f"unknown formats {sorted(unknown)}; choose from {FORMATS}")
    torch.set_num_threads(1)
    model = minillm.load("target")
    models = model_formats(model)
    prompt = torch.randint(1, model.config.vocab_size, (1, PROMPT),
                           generator=torch.Generator().manual_seed(0))
    default = compiled_decode.INDUCTOR_OPTIONS
    options = {"asserts": {"realize_opcount_threshold": 1}, "no asserts": default,
               "C++ wrapper": {**default, "cpp_wrapper": True}}
    for fmt in formats:
        m, fns = models[fmt], {}
        for name, opts in options.items():
            fns[name] = decode_steps(m, compiled_decode.CompiledDecoder(m, opts), prompt, STEPS)
        per_step = step_bytes(PackedDecoder(m, layout="out_in"), PROMPT + (STEPS - 1) / 2)
        fns["read"] = reader(per_step["bytes_per_step"], STEPS)
        times = cpu_time_interleaved(fns, warmup=1, repeats=args.repeats)
        limit = STEPS / median(times["read"])
        tok_s = {name: STEPS / median(times[name]) for name in options}
        print(f"{fmt}: " + ", ".join(f"{name} {t:.1f} tok/s ({t / limit:.2f} of the limit)"
                                     for name, t in tok_s.items())
              + "; over the default wrapper: " + ", ".join(
                  f"{name} {tok_s[name] / tok_s['asserts']:.3f}x" for name in list(options)[1:]),
              flush=True)


if __name__ == "__main__":
    main()
