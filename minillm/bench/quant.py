"""`minillm bench quant`: does storing the weights in fewer bits make decode faster, measured.

    minillm bench quant --threads 1 --json

The shipped model decodes greedily at batch 1 with its weights in four formats, same prompt,
same process, the decode steps timed interleaved (medians over `repeats` rounds after a warm-up):

  fp32   the checkpoint widened to fp32 (the baseline of the ratios)
  bf16   the checkpoint as shipped
  int8   bf16 model, every linear layer but lm_head int8 per output row (quantize_model "int8")
  int4   bf16 model, the same layers int4 with a scale and zero per group of 64 inputs

Each runs minillm's fastest batch-1 step, `CompiledDecoder` (one compiled function per format):
fp32, bf16 and int8 through products Inductor generates (for fp32 from `torch.mv`), int4
through torch's int4 CPU kernel (`minillm.decode.compiled.gemv` says why). The embedding, the norms and
lm_head of the quantized models stay bf16, as quantize_model leaves them.

Reported: `<fmt>_tok_s` (decode steps from a prefilled cache, as `bench decode`'s
`<variant>_step_tok_s`), `<fmt>_vs_fp32`, `model_bytes` (what the model stores, minillm.quant's
count) and `bytes_per_token` (what one step reads, `minillm.bench.bandwidth.step_bytes`) per format,
`read_gb_s` and each format's `bandwidth_fraction` of its own limit, and `tokens_match`: each
format's greedy tokens against fp32's with the first position where they part (bf16 rounding
alone can flip a near tie, so a divergence is reported, not hidden) and `top1_agreement`, the
fraction of fp32's generated positions where the format's most likely next token is fp32's, fed
fp32's text (after a divergence the greedy texts differ and no longer compare).
"""
from __future__ import annotations

import copy

import torch

from ..decode import CompiledDecoder, PackedDecoder, generate_packed
from ..quant import model_bytes, quantize_model
from .bandwidth import decode_limit, reader, step_bytes
from .decode import decode_steps
from .timing import cpu_time_interleaved, median, time_interleaved

FORMATS = ("fp32", "bf16", "int8", "int4")
GOALS = {"int8_vs_fp32": 1.5, "int4_vs_fp32": 1.8}     # issue 19, one thread


def model_formats(model, group_size: int = 64, formats=None) -> dict:
    """The four formats of `model` (left unchanged): {name: model}; formats: the quantized
    layers' format functions (kernels.formats.Formats; None: the course's)."""
    bf16 = copy.deepcopy(model).to(torch.bfloat16).eval()
    return {"fp32": copy.deepcopy(model).float().eval(), "bf16": bf16,
            "int8": quantize_model(bf16, "int8", formats=formats),
            "int4": quantize_model(bf16, f"int4-g{group_size}", formats=formats)}


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ (None: identical)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def bench_quant(model, prompt: list[int], *, new_tokens: int = 256, repeats: int = 5,
                group_size: int = 64, threads: int | None = None, compiled: bool = True,
                cpu_time: bool = False, formats=None) -> dict:
    """The report described in the module docstring. compiled=False runs each format's packed
    step op by op instead (`PackedDecoder`, layout "out_in": the float layers through torch's
    matmul, the quantized ones through QuantLinear's kernels): no compiler needed, and the
    per-op overhead of a step stays in the figures. cpu_time=True times every run in this
    process's CPU seconds (`cpu_time_interleaved`): on one thread a busy neighbour then cannot
    lengthen a run, which the wall clock (the default) counts. formats: the int8 and int4
    models' format functions (kernels.formats.Formats; lab 04 passes its student's)."""
    if not prompt:
        raise ValueError("the prompt is empty: give at least one token")
    if new_tokens < 2 or repeats < 1:
        raise ValueError(f"new_tokens must be >= 2 and repeats >= 1, got {new_tokens}, "
                         f"{repeats}")
    if len(prompt) + new_tokens > model.config.max_seq_len:
        raise ValueError(f"prompt ({len(prompt)}) + new_tokens ({new_tokens}) exceeds the "
                         f"model's context of {model.config.max_seq_len}")
    if threads is not None:
        torch.set_num_threads(threads)
    ids = torch.tensor([prompt])
    models = model_formats(model, group_size, formats)
    steps = new_tokens - 1
    context = len(prompt) + (steps - 1) / 2            # the steps' mean context
    fns, tokens, per_token, stored = {}, {}, {}, {}
    for name, m in models.items():
        dec = CompiledDecoder(m) if compiled else PackedDecoder(m, layout="out_in")
        tokens[name] = generate_packed(m, ids, new_tokens, dec)[0]     # compiles, warms up
        fns[name] = decode_steps(m, dec, ids, steps)
        per_token[name] = step_bytes(dec, context)["bytes_per_step"]
        stored[name] = model_bytes(m, float_bytes=4 if name == "fp32" else 2)
    fns["read"] = reader(per_token["fp32"], steps)
    times = (cpu_time_interleaved if cpu_time else time_interleaved)(fns, warmup=1,
                                                                     repeats=repeats)
    read_gb_s = steps * per_token["fp32"] / median(times["read"]) / 1e9
    r = {"step": "compiled" if compiled else "packed", "threads": torch.get_num_threads(),
         "prompt_len": len(prompt),
         "new_tokens": new_tokens, "repeats": repeats, "group_size": group_size,
         "read_gb_s": read_gb_s, "clock": "cpu" if cpu_time else "wall"}
    for name in FORMATS:
        r[f"{name}_tok_s"] = steps / median(times[name])
    for name in FORMATS[1:]:
        r[f"{name}_vs_fp32"] = r[f"{name}_tok_s"] / r["fp32_tok_s"]
    r["model_bytes"] = stored
    r["bytes_per_token"] = per_token
    r["limit_tok_s"] = {n: decode_limit(per_token[n], read_gb_s * 1e9) for n in FORMATS}
    r["bandwidth_fraction"] = {n: r[f"{n}_tok_s"] / r["limit_tok_s"][n] for n in FORMATS}
    r["tokens_match"] = {n: {"matches_fp32": tokens[n] == tokens["fp32"],
                             "first_divergence": first_divergence(tokens[n], tokens["fp32"])}
                         for n in FORMATS[1:]}
    seq = torch.tensor([prompt + tokens["fp32"][:-1]])       # fp32's text, teacher-forced
    with torch.no_grad():
        top1 = {n: models[n](seq)[0, len(prompt) - 1:].argmax(-1) for n in FORMATS}
    for n in FORMATS[1:]:
        r["tokens_match"][n]["top1_agreement"] = (top1[n] == top1["fp32"]).float().mean().item()
    r["goals"] = {k: {"at_least": v, "met": r[k] >= v} for k, v in GOALS.items()}
    return r
