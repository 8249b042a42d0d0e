"""Write the model card for the shipped checkpoints: python -m minillm.card

Every figure in minillm/assets/MODEL_CARD.md comes from this command: sizes from the weights,
training figures from each checkpoint's train_log.json, held-out loss/perplexity from
`minillm.evaluate.perplexity` on the validation split, samples from the seeded naive sampler.
"""
from __future__ import annotations

import json
import math
import platform
import time
from datetime import date

import torch

import minillm
from minillm.evaluate import perplexity
from minillm.generate import generate_naive
from minillm.sampling import SamplingParams

PROMPTS = ["ROMEO.\n", "To be, or not to be", "KING.\nMy lords,"]
OUT = minillm.ASSETS / "MODEL_CARD.md"


DIFFUSION_RATES = 4      # mask rates per held-out window in the diffusion model's NLL bound
DIFFUSION_STEPS = 32     # passes for a diffusion sample of 60 tokens (blocks of 16, T = 0.7)


def describe(name: str) -> dict:
    path = minillm.resolve(name)
    model, tok = minillm.load(name), minillm.load_tokenizer(name)
    log = json.loads((path / "train_log.json").read_text())
    if model.config.causal:
        ev = perplexity(model, tok, "val")
    else:                    # a masked-diffusion model: the ELBO bound on held-out NLL
        from minillm import diffusion
        from minillm.data import load_tokens
        loss, n = diffusion.nll_bound(model, load_tokens(tok, "val"), model.config.max_seq_len,
                                      rates_per_window=DIFFUSION_RATES)
        ev = {"split": "val", "tokens": n, "loss": loss, "ppl": math.exp(loss), "bound": True}
    samples = []
    for i, prompt in enumerate(PROMPTS):
        if model.config.causal:
            params = SamplingParams(temperature=0.8, top_k=50, max_new_tokens=60, seed=i,
                                    stop_ids=(tok.eos_id,))
            new = generate_naive(model, tok.encode(prompt), params)[0]
        else:
            from minillm import diffusion
            new, _ = diffusion.sample(model, tok.encode(prompt), 60, DIFFUSION_STEPS,
                                      temperature=0.7, block=16, seed=i)
        samples.append(prompt + tok.decode(new))
    c = model.config
    return {"name": name, "params": model.num_params(), "config": c,
            "file_bytes": (path / "model.safetensors").stat().st_size, "log": log, "eval": ev,
            "samples": samples}


ALPHA_K, ALPHA_TOKENS = 4, 128


def draft_alpha(target, draft, tok) -> float:
    """Acceptance rate of `draft` for `target` (greedy, k = ALPHA_K) pooled over PROMPTS."""
    from minillm.speculative import ModelDrafter, speculative_generate
    accepted = judged = 0
    for prompt in PROMPTS:
        _, st = speculative_generate(target, ModelDrafter(draft), tok.encode(prompt), ALPHA_K,
                                     SamplingParams(temperature=0, max_new_tokens=ALPHA_TOKENS))
        accepted, judged = accepted + st.accepted, judged + st.accepted + st.rejected
    return accepted / judged


def compare_drafts(cards: list[dict]) -> list[dict]:
    """The scratch draft, the distilled draft and the distilled draft before distillation."""
    from minillm.distill import pruned_only
    target, tok = minillm.load("target"), minillm.load_tokenizer("target")
    by_name = {c["name"]: c for c in cards}
    out = []
    for name in ("draft", "pruned only", "draft-distilled"):
        if name == "pruned only":
            log = by_name["draft-distilled"]["log"]
            model = pruned_only(log)
            ppl, tokens = perplexity(model, tok, "val")["ppl"], 0
        else:
            model = minillm.load(name)
            ppl, tokens = by_name[name]["eval"]["ppl"], by_name[name]["log"]["train_tokens_seen"]
        out.append({"name": name, "params": model.num_params(), "tokens": tokens, "ppl": ppl,
                    "alpha": draft_alpha(target, model, tok)})
    return out


def beyond_attention(cards: list[dict]) -> list[str]:
    """Lab 09's table: the target against the hybrid and the diffusion model."""
    from minillm import roofline
    by_name = {c["name"]: c for c in cards}
    row = [by_name[n] for n in ("target", "hybrid", "diffusion")]

    def layers(c):
        cfg = c["config"]
        return "".join("A" if i in cfg.attention_layers else "l" for i in range(cfg.n_layers))

    def state(c, S):
        if not c["config"].causal:
            return "no cache"
        return f"{roofline.kv_cache_bytes_per_seq(c['config'], S) / 2**20:.2f} MiB"

    def held_out(c):
        e = c["eval"]
        kind = "bound ≤ " if e.get("bound") else ""
        return f"{kind}{e['loss']:.3f} / {kind}{e['ppl']:.1f}"

    target_curve = {p["step"] * by_name["target"]["log"]["batch_size"]
                    * by_name["target"]["log"]["seq_len"]: p["val_loss"]
                    for p in by_name["target"]["log"]["curve"]}
    lines = ["", "## Lab 09: a hybrid and a diffusion model", "",
             "`hybrid` has 7 linear-attention layers (l: elu + 1 features, normaliser, RetNet's "
             "fixed per-head decay) and one softmax-attention layer (A), Jamba's 1:7; `diffusion` "
             "is a bidirectional transformer of the target's shape trained as a masked-diffusion "
             f"model (its held-out figure is the ELBO bound on the NLL, {DIFFUSION_RATES} "
             "stratified mask rates per window, so an upper bound on its perplexity). Both were "
             "trained by `python -m minillm.train` on the target's corpus and tokenizer. Decode "
             "state: bf16 bytes one sequence holds after S tokens (`roofline."
             "kv_cache_bytes_per_seq`).", "",
             "| | target | hybrid | diffusion |", "|---|---|---|---|"]
    for label, f in [("parameters", lambda c: f"{c['params']:,}"),
                     ("layers (A attention, l linear)", layers),
                     ("attention", lambda c: "causal" if c["config"].causal else "bidirectional"),
                     ("training tokens seen", lambda c: f"{c['log']['train_tokens_seen']:,}"),
                     ("training wall time", lambda c: f"{c['log']['wall_s'] / 60:.0f} min"),
                     ("held-out loss / perplexity", held_out),
                     ("decode state at S = 512", lambda c: state(c, 512)),
                     ("decode state at S = 8192", lambda c: state(c, 8192))]:
        lines.append(f"| {label} | " + " | ".join(f(c) for c in row) + " |")
    lines += ["", "The target's own curve at fewer tokens, for a comparison at equal training "
              "tokens (val loss on the first 32,768 held-out tokens, as in the causal models' "
              "curves below; the diffusion model's curve is its bound on the first 16,384 "
              "tokens, 2 mask rates per window): "
              + ", ".join(f"{t:,} tokens: {v:.3f}" for t, v in sorted(target_curve.items()))
              + "."]
    return lines


def render(all_cards: list[dict], drafts: list[dict] | None = None) -> str:
    # the first table: the Llama-family decoders; lab 09's models get their own section
    cards = [c for c in all_cards if c["config"].mixers is None and c["config"].causal]
    lines = ["# Shipped checkpoints: model card", "",
             f"Generated by `python -m minillm.card` on {date.today()} "
             f"({platform.machine()}, torch {torch.__version__}). Do not edit by hand.", "",
             "The models of this first table are Llama-style decoders (RMSNorm, RoPE, SwiGLU, "
             "tied embeddings) "
             "on the Shakespeare corpus in `data/shakespeare` (see data/PROVENANCE.md), sharing "
             "one byte-level BPE tokenizer. `target` and `draft` were trained from scratch by "
             "`python -m minillm.train`; `draft-distilled` was pruned from `target` by "
             "activation importance and distilled from it by `python -m minillm.distill` (lab "
             "08). Weights are stored in bf16 (Hugging Face Llama layout) and loaded "
             "into fp32. Held-out figures are on the validation split (two whole plays never "
             "seen in training), in windows of the model's 512-token context. Lab 09's `hybrid` "
             "and `diffusion` share the corpus, the tokenizer and the storage format; they have "
             "their own section below.", "",
             "| | " + " | ".join(c["name"] for c in cards) + " |",
             "|---|" + "---|" * len(cards)]
    rows = [
        ("parameters", lambda c: f"{c['params']:,}"),
        ("layers × dim (heads / KV heads)", lambda c: f"{c['config'].n_layers} × {c['config'].dim}"
                                                    f" ({c['config'].n_heads} / {c['config'].n_kv_heads})"),
        ("MLP hidden", lambda c: str(c["config"].hidden_dim)),
        ("context", lambda c: str(c["config"].max_seq_len)),
        ("weights file", lambda c: f"{c['file_bytes'] / 1e6:.1f} MB (bf16)"),
        ("training steps × batch × seq", lambda c: f"{c['log']['steps']} × {c['log']['batch_size']}"
                                                 f" × {c['log']['seq_len']}"),
        ("training tokens seen", lambda c: f"{c['log']['train_tokens_seen']:,} "
                                           f"({c['log']['train_tokens_seen'] / c['log']['train_tokens_available']:.1f} epochs)"),
        ("training wall time", lambda c: f"{c['log']['wall_s'] / 60:.0f} min on "
                                         f"{c['log'].get('device', 'cpu')}"),
        ("held-out tokens", lambda c: f"{c['eval']['tokens']:,}"),
        ("held-out loss (nats/token)", lambda c: f"{c['eval']['loss']:.3f}"),
        ("held-out perplexity", lambda c: f"{c['eval']['ppl']:.1f}"),
    ]
    for label, f in rows:
        lines.append(f"| {label} | " + " | ".join(f(c) for c in cards) + " |")
    lines += [""] + [f"`{c['name']}` has {c['params'] / cards[0]['params']:.3f}× the target's "
                     "parameters." for c in cards[1:]]
    if drafts:
        lines += ["", "## The drafts as speculative drafts for `target`", "",
                  f"Greedy speculative decoding with k = {ALPHA_K}, {ALPHA_TOKENS} new tokens "
                  f"after each of the {len(PROMPTS)} prompts below: alpha is the share of judged "
                  "draft tokens the target accepts. `pruned only` is `draft-distilled` before "
                  "distillation (re-derived from its train_log.json: the same calibration set, "
                  "shape and seed). Tokens spent: training tokens of the model itself (the "
                  "pruned drafts also read the calibration tokens, and inherit what the target "
                  "spent).", "",
                  "| draft | parameters | tokens spent | held-out perplexity | alpha |",
                  "|---|---|---|---|---|"]
        lines += [f"| {d['name']} | {d['params']:,} | {d['tokens']:,} | {d['ppl']:.1f} | "
                  f"{d['alpha']:.3f} |" for d in drafts]
    if {"hybrid", "diffusion"} <= {c["name"] for c in all_cards}:
        lines += beyond_attention(all_cards)
    for c in all_cards:
        key = "kd_loss" if "kd_loss" in (c["log"]["curve"] or [{}])[0] else "train_loss"
        label = "distillation (KL) loss" if key == "kd_loss" else "train loss"
        lines += ["", f"## {c['name']}: loss curve", "", f"| step | {label} | val loss |",
                  "|---|---|---|"]
        lines += [f"| {p['step']} | {p[key]:.3f} | {p['val_loss']:.3f} |"
                  for p in c["log"]["curve"]]
        how = ("temperature 0.8, top-k 50" if c["config"].causal else
               f"diffusion.sample: 60 tokens in {DIFFUSION_STEPS} passes, blocks of 16, "
               "temperature 0.7, as in lab 09")
        lines += ["", f"## {c['name']}: samples ({how}, seeds 0..2)", ""]
        for s in c["samples"]:
            lines += ["```text", s.strip("\n"), "```", ""]
    return "\n".join(lines).rstrip() + "\n"


def main():
    t0 = time.time()
    cards = [describe(n) for n in ("target", "draft", "draft-distilled", "hybrid", "diffusion")]
    drafts = compare_drafts(cards)
    OUT.write_text(render(cards, drafts))
    print(f"wrote {OUT} in {time.time() - t0:.0f}s")
    for c in cards:
        print(json.dumps({"model": c["name"], "params": c["params"], "loss": c["eval"]["loss"],
                          "ppl": c["eval"]["ppl"], "tokens": c["eval"]["tokens"]}))
    for d in drafts:
        print(json.dumps(d))


if __name__ == "__main__":
    main()
