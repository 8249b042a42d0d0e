"""`minillm bench decode`: tokens per second of the naive loop, the KV-cached loop and (optionally)
Hugging Face `generate` on the same weights, measured interleaved in one process.

    minillm bench decode --model target --prompt-len 32 --new-tokens 256 --vs-hf --json

Variants: `naive` (lab 00's loop, the whole prefix every step), `cached_loop` (lab 02's loop:
`Transformer.forward` with a `KVCache`), `cached` (the same cache with the packed decode step of
`minillm.decode.packed`, reported as `cached_tok_s`), `fused` (batch 1: the step compiled into
one C++ function, `minillm.decode.compiled` -- minillm's fastest path), optionally
`compiled` (the cached loop under torch.compile) and `hf`.

On the bandwidth scale (`minillm.bench.bandwidth`), for the decode steps alone (`cached` and `fused`
steps from a prefilled cache, `<variant>_step_tok_s`): `bytes_per_token` is counted from the
packed decoder's tensors and the cache at the steps' mean context; `read` is a pass over a buffer
of one step's bytes per step, timed interleaved with the variants, which gives `read_gb_s` and
the ceiling `limit_tok_s`; `<variant>_bandwidth_fraction` is step tokens/s over that ceiling, and
`bandwidth_fraction` the better of the two. Every variant decodes greedily from the same
random prompt; the report says whether their tokens agree. Hugging Face runs our checkpoint written in its Llama layout and loaded with
`AutoModelForCausalLM.from_pretrained` (transformers is only a comparison here, never a dependency
of generation). Speeds are medians over `repeats` interleaved rounds after one warm-up round (the
naive loop skips the warm-up: one run of it is long enough to warm itself up); ratios are of those
medians (see minillm.bench.timing). `--repeats 1 --no-fused-step` is the quickest full comparison: the
naive loop runs once. With `cpu_time` every run is timed in CPU seconds of this process
(`minillm.bench.timing.cpu_time_interleaved`): on one thread (`--threads 1`) a busy neighbour then
adds nothing to any variant, where the wall clock charges it to whichever run it overlaps (a
30-second naive run more than a 3-second cached one); with several threads the CPU seconds of
all of them add up, so tokens/s are per CPU second, not per second.
"""
from __future__ import annotations

import tempfile

import torch

from ..decode import CompiledDecoder, PackedDecoder, generate_packed
from ..generate import generate_cached, generate_naive
from ..kvcache import KVCache
from ..sampling import SamplingParams
from .bandwidth import bandwidth_report, reader, step_bytes
from .timing import cpu_time_interleaved, median, time_interleaved

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_as_hf(model):
    """Our model as a transformers LlamaForCausalLM with identical weights (via a checkpoint)."""
    try:
        import transformers
        from transformers import AutoModelForCausalLM
    except ImportError as e:     # pragma: no cover - transformers is in the dev extra
        raise RuntimeError("--vs-hf needs the transformers package (pip install transformers)"
                           ) from e
    from ..weights import save_checkpoint
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    dtype = next(model.parameters()).dtype
    with tempfile.TemporaryDirectory() as d:
        save_checkpoint(model, d)
        hf = AutoModelForCausalLM.from_pretrained(d, dtype=dtype).eval()
    hf.generation_config.eos_token_id = None     # decode exactly new_tokens, like ours
    hf.generation_config.pad_token_id = 0
    return hf


def compiled_decoder(model):
    """A cached greedy decoder whose one-token step is `torch.compile`d (dynamic cache length)."""
    step = torch.compile(model, dynamic=True)

    @torch.no_grad()
    def run(prompt: torch.Tensor, n: int) -> list[list[int]]:
        cache = KVCache.for_model(model, prompt.shape[0], prompt.shape[1] + n)
        nxt = model(prompt, cache=cache, last_only=True)[:, -1].argmax(-1)
        out = [nxt]
        for _ in range(n - 1):
            nxt = step(nxt[:, None], cache=cache)[:, -1].argmax(-1)
            out.append(nxt)
        return torch.stack(out, 1).tolist()
    return run


def decode_steps(model, decoder, prompt: torch.Tensor, steps: int):
    """A function that runs `steps` greedy decode steps of `decoder` from `prompt`, prefilled
    once here into a cache that each call rolls back: it times the step, not the prefill."""
    cache = KVCache.for_model(model, prompt.shape[0], prompt.shape[1] + steps)
    with torch.no_grad():
        first = model(prompt, cache=cache, last_only=True)[:, -1].argmax(-1)

    def run():
        cache.truncate(prompt.shape[1])
        nxt = first
        for _ in range(steps):
            nxt = decoder.step(nxt, cache).argmax(-1)
    return run


def bench_decode(model, *, prompt_len: int = 32, new_tokens: int = 256, batch: int = 1,
                 naive: bool = True, vs_hf: bool = False, compile: bool = False,
                 fused_step: bool = True, repeats: int = 3, seed: int = 0,
                 threads: int | None = None, cpu_time: bool = False) -> dict:
    if prompt_len < 1 or new_tokens < 1 or batch < 1 or repeats < 1:
        raise ValueError("prompt_len, new_tokens, batch and repeats must all be >= 1")
    ctx = model.config.max_seq_len
    if prompt_len + new_tokens > ctx:
        raise ValueError(f"prompt_len + new_tokens = {prompt_len + new_tokens} exceeds the "
                         f"model's context of {ctx}")
    if threads is not None:
        torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(1, model.config.vocab_size, (batch, prompt_len), generator=g)
    params = SamplingParams(temperature=0.0, max_new_tokens=new_tokens)

    packed = PackedDecoder(model)
    fns = {"cached": lambda: generate_packed(model, prompt, new_tokens, packed),
           "cached_loop": lambda: generate_cached(model, prompt, params)}
    fused_step = fused_step and batch == 1
    if fused_step:
        fast = CompiledDecoder(model)
        fns["fused"] = lambda: generate_packed(model, prompt, new_tokens, fast)
    # the decode steps alone (from a prefilled cache rolled back each run) against a read of
    # one step's bytes (at the steps' mean context) per step
    steps = max(new_tokens - 1, 1)
    per_step = step_bytes(packed, prompt_len + (steps - 1) / 2, batch)["bytes_per_step"]
    fns["read"] = reader(per_step, steps)
    step_fns = {"cached": decode_steps(model, packed, prompt, steps)}
    if fused_step:
        step_fns["fused"] = decode_steps(model, fast, prompt, steps)
    fns.update({f"{name} steps": fn for name, fn in step_fns.items()})
    if compile:
        run_compiled = compiled_decoder(model)
        fns["compiled"] = lambda: run_compiled(prompt, new_tokens)
    if naive:
        fns["naive"] = lambda: generate_naive(model, prompt, params)
    if vs_hf:
        hf = load_as_hf(model)

        @torch.no_grad()
        def run_hf():
            out = hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                              max_new_tokens=new_tokens, min_new_tokens=new_tokens)
            return out[:, prompt_len:].tolist()
        fns["hf"] = run_hf

    # One untimed round warms every variant up and records its tokens -- except the naive loop:
    # its first steps warm it up as well as a whole extra run would, and at 480 new tokens one
    # run takes half a minute of CPU time, so its tokens come from its timed runs instead.
    outputs = {name: fn() for name, fn in fns.items() if name != "naive"}
    if naive:
        run_naive = fns["naive"]
        fns["naive"] = lambda: outputs.__setitem__("naive", run_naive())
    timer = cpu_time_interleaved if cpu_time else time_interleaved
    times = timer(fns, warmup=0, repeats=repeats)
    n_tok = batch * new_tokens
    speeds = {name: batch * steps / median(times[f"{name} steps"]) for name in step_fns}
    r = {"model_params": model.num_params(), "dtype": str(next(model.parameters()).dtype),
         "threads": torch.get_num_threads(), "batch": batch, "prompt_len": prompt_len,
         "new_tokens": new_tokens, "repeats": repeats,
         "clock": "cpu" if cpu_time else "wall",
         "cached_tok_s": n_tok / median(times["cached"]),
         "cached_loop_tok_s": n_tok / median(times["cached_loop"]),
         "cached_loop_matches_cached": outputs["cached_loop"] == outputs["cached"],
         **{f"{name}_step_tok_s": v for name, v in speeds.items()},
         **bandwidth_report(per_step / batch, batch * steps, median(times["read"]), speeds)}
    if fused_step:
        r["fused_tok_s"] = n_tok / median(times["fused"])
        r["fused_matches_cached"] = outputs["fused"] == outputs["cached"]
    r["bandwidth_fraction"] = max(r[f"{name}_bandwidth_fraction"] for name in speeds)
    if naive:
        r["naive_tok_s"] = n_tok / median(times["naive"])
        r["cached_vs_naive"] = r["cached_tok_s"] / r["naive_tok_s"]
        r["naive_matches_cached"] = outputs["naive"] == outputs["cached"]
        if fused_step:
            r["naive_matches_fused"] = outputs["naive"] == outputs["fused"]
    if compile:
        r["compiled_tok_s"] = n_tok / median(times["compiled"])
        r["compiled_vs_cached_loop"] = r["compiled_tok_s"] / r["cached_loop_tok_s"]
        r["compiled_matches_cached"] = outputs["compiled"] == outputs["cached"]
    if vs_hf:
        r["hf_tok_s"] = n_tok / median(times["hf"])
        r["cached_vs_hf"] = r["cached_tok_s"] / r["hf_tok_s"]
        r["hf_matches_cached"] = outputs["hf"] == outputs["cached"]
        if compile:
            r["compiled_vs_hf"] = r["compiled_tok_s"] / r["hf_tok_s"]
    return r
