"""Survey: KV-cache bytes per token vs held-out perplexity for every variant of lab 03.

Each variant is converted from the same trained multi-head model *without any training*, so the
table shows how much each idea costs when bolted on after the fact -- the papers train (GQA: a few
percent "uptraining"; MLA, CLA: from scratch) and recover most of it.

    rows = survey(model, tokenizer, max_tokens=4096)
    for r in rows: print(r["name"], r["kv_bytes_per_token"], round(r["ppl"], 1))

kv_bytes_per_token is bf16 (2 bytes per value) summed over layers. A sliding-window layer holds at
most `window` tokens, so its bytes are amortised over `seq_len` tokens (default: the model's
context, 512 for the shipped model, which is also the length of the windows perplexity is
evaluated on): it costs window / seq_len of a full layer per token.
"""
from __future__ import annotations

import time
from typing import Callable

from ..evaluate import perplexity
from ..kvcache import kv_bytes_per_token, layer_specs
from .cla import to_cla
from .gqa import to_gqa
from .mla import DEFAULT_ROPE_DIM, to_mla
from .sliding import to_sliding

Variant = tuple[str, str, Callable]          # (name, family, model -> converted model)


def default_variants(model) -> list[Variant]:
    """The lab 03 line-up for `model`: MHA; GQA for every K dividing the KV heads, down to MQA;
    MLA with latents that cache as many values per layer as each GQA row (C + R = 2 K H), plus
    the smallest with the "svd" shared rope key; CLA sharing 2 and 3 layers; sliding windows of
    128 and 64 tokens with one global layer in six."""
    cfg = model.config
    H = cfg.head_dim
    R = min(DEFAULT_ROPE_DIM, H // 2)      # half the head carries RoPE (DeepSeek-V2's ratio)
    ks = sorted((k for k in range(1, cfg.n_kv_heads) if cfg.n_kv_heads % k == 0), reverse=True)
    out: list[Variant] = [("MHA", "MHA", lambda m: m)]
    for k in ks:
        name = "MQA (K=1)" if k == 1 else f"GQA K={k}"
        out.append((name, "GQA", lambda m, k=k: to_gqa(m, k)))
    latents = [2 * k * H - R for k in ks if 0 < 2 * k * H - R <= cfg.dim]
    if cfg.n_kv_heads != cfg.n_heads:          # to_mla converts multi-head models only
        latents = []
    for c in latents:
        out.append((f"MLA C={c} R={R}", "MLA", lambda m, c=c: to_mla(m, c, rope_dim=R)))
    if latents:
        c = latents[-1]
        out.append((f"MLA C={c} R={R} svd key", "MLA",
                    lambda m, c=c: to_mla(m, c, rope_dim=R, rope_key="svd")))
    for share in (2, 3):
        if share <= cfg.n_layers:
            out.append((f"CLA share={share}", "CLA", lambda m, s=share: to_cla(m, s)))
    for w in (128, 64):
        out.append((f"SWA w={w}, 1 global in 6", "sliding",
                    lambda m, w=w: to_sliding(m, w, global_every=6)))
    return out


def survey(model, tokenizer, *, max_tokens: int, variants=None, seq_len: int | None = None,
           progress: bool = False) -> list[dict]:
    """Convert `model` into each variant and measure it. Returns one dict per variant:
    name, family, kv_bytes_per_token (bf16, sliding layers amortised at seq_len), ppl, loss
    (held-out, first `max_tokens` tokens of the val split), params, convert_s, eval_s.

    variants: None for `default_variants(model)`, or a list of names from it, or of your own
    (name, family, build) tuples.
    """
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 2:
        raise ValueError(f"max_tokens must be an integer >= 2, got {max_tokens!r}")
    seq_len = model.config.max_seq_len if seq_len is None else seq_len
    if not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len must be a positive integer, got {seq_len!r}")
    table = default_variants(model)
    if variants is None:
        chosen = table
    else:
        by_name = {v[0]: v for v in table}
        chosen = []
        for v in variants:
            if isinstance(v, str):
                if v not in by_name:
                    raise ValueError(f"unknown variant {v!r}; known: {sorted(by_name)}")
                chosen.append(by_name[v])
            elif isinstance(v, tuple) and len(v) == 3 and callable(v[2]):
                chosen.append(v)
            else:
                raise ValueError(f"a variant is a name or a (name, family, build) tuple, got {v!r}")
    if progress:
        from tqdm.auto import tqdm
        chosen = tqdm(chosen, desc="survey")
    rows = []
    for name, family, build in chosen:
        t0 = time.perf_counter()
        m = build(model)
        t1 = time.perf_counter()
        r = perplexity(m, tokenizer, split="val", max_tokens=max_tokens)
        t2 = time.perf_counter()
        rows.append({"name": name, "family": family,
                     "kv_bytes_per_token": kv_bytes_per_token(layer_specs(m), 2, seq_len),
                     "ppl": r["ppl"], "loss": r["loss"], "params": m.num_params(),
                     "convert_s": t1 - t0, "eval_s": t2 - t1})
    return rows
