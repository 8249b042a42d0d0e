"""`minillm bench tp`'s report in words (the figures are minillm/bench/tp.py's)."""
from __future__ import annotations


def text(r: dict) -> str:
    """The report in words: when the split pays on this machine, and why."""
    f = r["all_reduce"]["fit"]
    ms = 1e3
    lines = [f"bench tp: {r['cpus']} CPUs, batch-1 decode after {r['context']} cached tokens, "
             f"fp32; medians of {r['repeats']} interleaved rounds",
             f"all-reduce, 2 ranks: alpha {f['alpha_s'] * ms:.3f} ms, link "
             f"{f['link_bytes_per_s'] / 1e9:.2f} GB/s (fit of t = alpha + 2(W-1)/W bytes/link)",
             "  floats      measured ms  napkin ms  ratio"]
    for a in r["all_reduce"]["rows"]:
        lines.append(f"  {a['floats']:>9}  {a['median_s'] * ms:>11.3f}  "
                     f"{a['predicted_s'] * ms:>9.3f}  {a['measured_over_fit']:5.2f}")
    lines.append(f"  worst ratio {r['all_reduce']['worst_ratio']:.2f} "
                 f"({'within' if r['all_reduce']['within_2x'] else 'NOT within'} 2x)")
    for W, w in r["worlds"].items():
        lines.append("")
        if W != "2":
            lines.append(f"all-reduce, {W} ranks: alpha {w['fit']['alpha_s'] * ms:.3f} ms, link "
                         f"{w['fit']['link_bytes_per_s'] / 1e9:.2f} GB/s")
        if w["model_skipped"]:
            lines.append(f"{r['model']} is left out at TP = {W}: {w['model_skipped']}")
        lines += [f"TP = {W} (1 thread per rank) against TP = 1 on 1 thread and on {W} "
                  f"threads; napkin in brackets, ms per step",
                  f"  {'model':<10} {'TP=1, 1 thr':>17} {'TP=1, ' + W + ' thr':>17} "
                  f"{'TP=' + W:>17} {'split/whole':>11} {'all-reduces':>17}"]
        for s in w["steps"]:
            p = s["predicted"]
            lines.append(
                f"  {s['name']:<10} {s['tp1_1thread_s'] * ms:>7.2f} ({p['tp1_1thread_s'] * ms:>7.2f})"
                f" {s['tp1_wthreads_s'] * ms:>7.2f} ({p['tp1_wthreads_s'] * ms:>7.2f})"
                f" {s['tp_s'] * ms:>7.2f} ({p['tp_s'] * ms:>7.2f}) {s['split_over_whole']:>11.2f}"
                f" {s['tp_allreduces_s'] * ms:>7.2f} ({p['tp_comm_s'] * ms:>7.2f})")
        c = w["crossover"]
        lines.append(_crossover_words(c, W, w))
        for cp in w["copies_vs_split"]:
            lines.append(f"  copies vs split at {cp['name']}: {W} copies "
                         f"{cp['copies_tok_s']:.0f} tok/s, split {cp['split_tok_s']:.0f} tok/s "
                         f"(copies x{cp['throughput_ratio']:.2f} throughput); per-token latency "
                         f"{cp['copies_latency_s'] * ms:.2f} ms vs {cp['split_latency_s'] * ms:.2f}"
                         f" ms (copies/split {cp['latency_ratio']:.2f})")
    return "\n".join(lines)


def _crossover_words(c: dict, W: str, w: dict) -> str:
    meas = (f"measured at D ~ {c['measured_dim']:.0f}" if c["measured_dim"] is not None
            else f"measured: none ({c['measured_reason']})")
    pred = (f"predicted at D ~ {c['predicted_dim']:.0f}" if c["predicted_dim"] is not None
            else f"predicted: none ({c['predicted_reason']})") + " by the napkin with the " \
        "fitted alpha and link and the bandwidth each rank got while all read at once"
    own = ("none" if c["predicted_dim_own_memory"] is None
           else f"D ~ {c['predicted_dim_own_memory']:.0f}")
    ratio = ("" if c["measured_over_predicted"] is None else
             f" (ratio {c['measured_over_predicted']:.2f})")
    alpha, seen = w["fit"]["alpha_s"], c["in_step_alpha_s"]
    n_ar = 2 * w["steps"][-1]["layers"]
    seen_pred = (f"D ~ {c['predicted_dim_as_seen']:.0f}"
                 if c["predicted_dim_as_seen"] is not None
                 else f"none ({c['predicted_as_seen_reason']})")
    eq = w["equal_threads_wins"]
    return (f"  The split pays once the weights one rank no longer reads save more than the "
            f"all-reduces cost: {n_ar} per step at alpha {alpha * 1e3:.2f} ms each in the "
            f"sweep ({n_ar * alpha * 1e3:.2f} ms before any bytes move). Crossover {meas}, "
            f"{pred}{ratio}; with every rank reading as fast as one core alone (lab 01's "
            f"devices, each its own memory) the napkin says {own}. Inside the split step an "
            f"all-reduce cost {seen * 1e3:.2f} ms beyond its bytes (waiting for the slower "
            f"rank included), not {alpha * 1e3:.2f}: with that alpha the napkin says {seen_pred}. "
            f"At equal total threads ({W} threads in one process) the split "
            + (f"beats it at {', '.join(eq)}." if eq else
               "never wins: one process on all threads splits the same reads with no "
               "all-reduce."))
