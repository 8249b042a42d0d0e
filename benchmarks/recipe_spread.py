"""Lab 00's sampling-recipe task: each recipe's figures over many sets of prompts, to place the
thresholds (autograder/labs/lab00.py: RECIPE_MAX_NLL, RECIPE_MIN_DISTINCT) with margins.

    python -m benchmarks.recipe_spread --sets 20          # seeds 100-119, ~5 min on a busy core

Prints, per recipe, the mean NLL under the target (nats/token) and the mean distinct-2 of the
16 texts of each set: mean, standard deviation and range over the sets.
"""
from __future__ import annotations

import argparse
import statistics

import torch

from autograder.labs import lab00
from minillm.sampling import top_k_filter, top_p_filter


def _greedy(z, ids):
    return z.masked_fill(z < z.max(-1, keepdim=True).values, float("-inf"))


def _min_p(z, fraction):
    p = torch.softmax(z, -1)
    return z.masked_fill(p < fraction * p.max(-1, keepdim=True).values, float("-inf"))


def _no_repeated_bigram(z, ids):
    """Greedy, but never a pair of tokens the text already holds."""
    z = z.clone()
    for b in range(ids.shape[0]):
        row = ids[b].tolist()
        for first, second in zip(row, row[1:]):
            if first == row[-1]:
                z[b, second] = float("-inf")
    return _greedy(z, ids)


RECIPES = {
    "greedy": _greedy,
    "T0.3": lambda z, ids: z / 0.3,
    "T0.5": lambda z, ids: z / 0.5,
    "T0.7": lambda z, ids: z / 0.7,
    "T1": lambda z, ids: z,
    "T2": lambda z, ids: z / 2,
    "p0.9": lambda z, ids: top_p_filter(z, 0.9),
    "p0.7": lambda z, ids: top_p_filter(z, 0.7),
    "T0.8p0.9": lambda z, ids: top_p_filter(z / 0.8, 0.9),
    "k40T0.8": lambda z, ids: top_k_filter(z / 0.8, 40),
    "minp0.1": lambda z, ids: _min_p(z, 0.1),
    "no_repeated_bigram": _no_repeated_bigram,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=100)
    args = parser.parse_args()
    torch.set_num_threads(1)
    figures: dict = {name: [] for name in RECIPES}
    for seed in range(args.first_seed, args.first_seed + args.sets):
        prompts = lab00.recipe_prompts(seed)
        for name, recipe in RECIPES.items():
            samples = lab00.recipe_samples(recipe, prompts, lab00.RECIPE_NEW, seed)
            figures[name].append(lab00.recipe_scores(prompts, samples))
    print(f"{args.sets} sets of {lab00.RECIPE_TEXTS} texts x {lab00.RECIPE_NEW} tokens; thresholds: "
          f"NLL <= {lab00.RECIPE_MAX_NLL}, distinct-2 >= {lab00.RECIPE_MIN_DISTINCT}")
    for name, rows in figures.items():
        cols = []
        for key in ("nll", "distinct"):
            v = [r[key] for r in rows]
            cols.append(f"{key} {statistics.mean(v):.3f} sd {statistics.pstdev(v):.3f} "
                        f"[{min(v):.3f}, {max(v):.3f}]")
        print(f"{name:19s} " + "   ".join(cols))


if __name__ == "__main__":
    main()
