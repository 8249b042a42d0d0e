"""Lab 09's three measurements, outside the notebook, for benchmarks/RESULTS.md and the note.

    .venv/bin/python benchmarks/beyond_attention.py [--threads 1] [--part decode,recall,diffusion,chunk]

* decode: one batch-1 decode step of `target` and `hybrid` against the context (caches filled by
  minillm.bench.decode_memory.filled_cache), every pair in the same interleaved rounds, medians of 7
  of CPU time; the bytes each cache holds;
* recall: MQAR accuracy against N for one-layer width-64 models (attention; linear attention with
  1, 2, 4 heads), trained as the lab trains them (minillm.recall.train_recall's defaults),
  and the numbers each linear model's state holds;
* diffusion: 64 tokens after three prompts in 64..4 passes (minillm.diffusion.sample, confidence
  order, temperature 0.7, blocks of 16, seeds 0..2): the target's perplexity of each continuation
  and its share of blank tokens, the target's own samples at 0.7; the latency of 64 greedy tokens
  against the target's KV-cached greedy loop (interleaved, medians of 3 of CPU time); the held-out
  perplexity of the target and the diffusion model's bound on 4,096 tokens;
* chunk: linear_attention.chunked over T tokens against the chunk size C (powers of two up to
  1,024) for five shapes, every C of a shape in the same interleaved rounds, medians of 3 of CPU
  time; and the constants of minillm/bench/chunk_model.py fitted to them (least squares on the
  relative error), with the model's time beside each measured one.

The lab's cells run the same functions with the same settings; this script prints their figures.
They feed benchmarks/RESULTS.md, "Beyond attention: a hybrid and a diffusion model".
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import time

import torch

import minillm
from minillm import diffusion, linear_attention, recall
from minillm.bench import chunk_model
from minillm.bench.decode_memory import decode_step_times, filled_cache
from minillm.bench.timing import cpu_time_interleaved, median
from minillm.data import load_tokens
from minillm.evaluate import continuation_perplexity
from minillm.generate import generate_cached
from minillm.sampling import SamplingParams
from minillm.train import evaluate

CONTEXTS = [256, 1024, 2048, 4096, 8192]
RECALL_NS = [4, 8, 16, 32, 64]
RECALL_MODELS = {"attention": ("attention", 1), "linear, H = 64": ("linear", 1),
                 "linear, H = 32": ("linear", 2), "linear, H = 16": ("linear", 4)}
PROMPTS = ["ROMEO.\nBut soft, what light through yonder window breaks?\n",
           "HAMLET.\nTo be, or not to be, that is the question:\n",
           "KING.\nNow is the winter of our discontent\n"]
N_NEW, STEPS, TEMP, BLOCK = 64, [64, 32, 16, 8, 4], 0.7, 16


def decode_part() -> dict:
    models = {"target": minillm.load("target"), "hybrid": minillm.load("hybrid")}
    mem = {n: [filled_cache(m, S).nbytes for S in CONTEXTS] for n, m in models.items()}
    t = decode_step_times(models, CONTEXTS, repeats=7)
    return {"contexts": CONTEXTS, "state_bytes": mem,
            "step_ms": {n: [round(x * 1e3, 2) for x in v] for n, v in t.items()},
            "growth": {n: round(v[-1] / v[0], 2) for n, v in t.items()}}


def recall_part() -> dict:
    acc, state = {}, {}
    for name, (mixer, heads) in RECALL_MODELS.items():
        m = recall.recall_model(mixer, dim=64, n_layers=1, n_heads=heads, seed=0)
        if mixer == "linear":
            state[name] = recall.state_numbers(m)
        recall.train_recall(m)
        acc[name] = [round(recall.recall_accuracy(m, n), 3) for n in RECALL_NS]
    return {"n_pairs": RECALL_NS, "accuracy": acc, "state_numbers": state}


def diffusion_part() -> dict:
    target, dlm = minillm.load("target"), minillm.load("diffusion")
    tok = minillm.load_tokenizer("target")

    def judge(p, new):
        return continuation_perplexity(target, p, new)

    greedy = SamplingParams(max_new_tokens=N_NEW, temperature=0.0)
    quality, blank = {}, {}
    for s in STEPS:
        news = [(tok.encode(p), diffusion.sample(dlm, tok.encode(p), N_NEW, s, temperature=TEMP,
                                                 block=BLOCK, seed=seed)[0])
                for seed, p in enumerate(PROMPTS)]
        quality[s] = [round(judge(ids, new), 1) for ids, new in news]
        blank[s] = [round(sum(tok.decode([i]).strip() == "" for i in new) / len(new), 2)
                    for _, new in news]
    ar = [round(judge(tok.encode(p), generate_cached(target, [tok.encode(p)], SamplingParams(
        max_new_tokens=N_NEW, temperature=TEMP, seed=seed))[0]), 1)
        for seed, p in enumerate(PROMPTS)]
    ids = tok.encode(PROMPTS[0])
    fns = {f"diffusion {s}": (lambda s=s: diffusion.sample(dlm, ids, N_NEW, s)) for s in STEPS}
    fns["target AR"] = lambda: generate_cached(target, [ids], greedy)
    lat = {k: round(median(v) * 1e3, 1)
           for k, v in cpu_time_interleaved(fns, warmup=1, repeats=3).items()}
    val = load_tokens(tok, "val")
    held_t = evaluate(target, val, 512, max_tokens=4096)[0]
    held_d = diffusion.nll_bound(dlm, val, 512, rates_per_window=4, max_tokens=4096)[0]
    return {"steps": STEPS, "judge_ppl": quality, "blank_share": blank,
            "target_ar_judge_ppl": ar, "latency_ms": lat,
            "held_out_ppl_target": round(math.exp(held_t), 1),
            "held_out_ppl_bound_diffusion": round(math.exp(held_d), 1)}


CHUNK_SHAPES = [(1, 6, 1024, 64), (1, 2, 2048, 32), (4, 8, 1024, 64), (1, 1, 2048, 16),
                (2, 4, 512, 128)]          # (batch B, heads N, tokens T, head_dim H)


def chunk_part() -> dict:
    torch.manual_seed(0)
    sweep = {}
    for B, N, T, H in CHUNK_SHAPES:
        q, k, v = (torch.randn(B, N, T, H) for _ in range(3))
        dec = linear_attention.head_decays(N).float()
        fns = {c: (lambda c=c: linear_attention.chunked(q, k, v, dec, c))
               for c in (2 ** i for i in range(11)) if c <= T}
        t = cpu_time_interleaved(fns, warmup=1, repeats=3)
        sweep[(B, N, T, H)] = {c: round(median(x) * 1e6) for c, x in t.items()}
    fitted = fit_chunk_model(sweep)
    model = {str(s): {c: round(chunk_model.chunk_time_us(s[2], s[0], s[1], s[3], c, fitted))
                      for c in row} for s, row in sweep.items()}
    return {"sweep_us": {str(s): row for s, row in sweep.items()}, "model_us": model,
            "fitted": fitted}


def fit_chunk_model(sweep: dict) -> dict:
    """chunk_model's four constants by least squares on the relative error: the model is linear
    in per_chunk_us, per_state_value_us, 1 / flops_per_us and per_score_us."""
    unit = {"per_chunk_us": 1.0, "per_state_value_us": 1.0, "flops_per_us": 1.0,
            "per_score_us": 1.0}
    rows, ys = [], []
    for (B, N, T, H), row in sweep.items():
        for c, us in row.items():
            cols = []
            for key in unit:      # each column: the model with one constant's term alone
                only = {k: (1.0 if k == key else (float("inf") if k == "flops_per_us" else 0.0))
                        for k in unit}
                cols.append(chunk_model.chunk_time_us(T, B, N, H, c, only))
            rows.append([x / us for x in cols])
            ys.append(1.0)
    a = torch.linalg.lstsq(torch.tensor(rows, dtype=torch.float64),
                           torch.tensor(ys, dtype=torch.float64)[:, None]).solution[:, 0].tolist()
    return {"per_chunk_us": round(a[0], 1), "per_state_value_us": float(f"{a[1]:.2g}"),
            "flops_per_us": float(f"{1 / a[2]:.2g}"), "per_score_us": float(f"{a[3]:.2g}")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--part", default="decode,recall,diffusion,chunk")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    out = {"machine": platform.machine(), "torch": torch.__version__, "threads": a.threads}
    for part in a.part.split(","):
        t0 = time.time()
        out[part] = {"decode": decode_part, "recall": recall_part,
                     "diffusion": diffusion_part, "chunk": chunk_part}[part]()
        out[part]["seconds"] = round(time.time() - t0, 1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
