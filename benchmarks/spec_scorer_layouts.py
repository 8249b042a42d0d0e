"""Which weight layout should the target's verify passes use in speculative decoding?

    .venv/bin/python benchmarks/spec_scorer_layouts.py [--new-tokens 128] [--repeats 3]

Greedy speculative decoding of the shipped target with `draft-distilled` (its steps compiled over
int8 weights), for k = 2, 3, 4, with the verify passes on (a) the plain loop's own packed weights
(layout "in_out", one copy of the weights), (b) a second copy in PyTorch's [out, in] layout,
(c) a second copy in oneDNN's blocked layout; each against the target alone with its packed step,
in process CPU time on one thread, interleaved, medians. Timed alone, the [out, in] and oneDNN
products beat "in_out" for some row counts; inside the loop, with a second 49 MB copy of the
weights competing for the cache, this measures whether that survives.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import minillm
from minillm.decode import PackedDecoder, generate_packed, onednn_available
from minillm.sampling import SamplingParams
from minillm.speculative import ModelDrafter, speculative_generate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    target, draft = minillm.load("target"), minillm.load("draft-distilled")
    tok = minillm.load_tokenizer("target")
    prompt = tok.encode("HAMLET.\nTo be, or not to be, that is the question:\n")
    plain = PackedDecoder(target)
    scorers = {"in_out (shared with the plain loop)": plain,
               "out_in (second copy)": PackedDecoder(target, "out_in")}
    if onednn_available():
        scorers["onednn (second copy)"] = PackedDecoder(target, "onednn")
    drafter = ModelDrafter(draft, engine="compiled-int8")
    params = SamplingParams(temperature=0, max_new_tokens=a.new_tokens)
    ks = (2, 3, 4)
    times = {(name, k): [] for name in scorers for k in ks}
    base = []
    for rep in range(a.repeats + 1):                  # the first round warms up (and compiles)
        t0 = time.process_time()
        want = generate_packed(target, torch.tensor([prompt]), a.new_tokens, plain)[0]
        if rep:
            base.append(time.process_time() - t0)
        for k in ks:
            for name, scorer in scorers.items():
                t0 = time.process_time()
                out, _ = speculative_generate(target, drafter, prompt, k, params, scorer=scorer)
                if rep:
                    times[(name, k)].append(time.process_time() - t0)
                assert out == want, f"{name}, k = {k}: not the target's greedy output"
    b = statistics.median(base)
    for (name, k), ts in times.items():
        print(f"{name:>36} k = {k}: speed-up {b / statistics.median(ts):.2f}x")


if __name__ == "__main__":
    main()
