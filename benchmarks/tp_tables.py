"""The tables of benchmarks/RESULTS.md's tensor-parallelism section, rendered from a recorded
`minillm bench tp --json` (the figures are the command's; this only lays them out):

    PYTHONPATH=. python -m minillm bench tp --json > benchmarks/tp_recorded.json
    PYTHONPATH=. python -m benchmarks.tp_tables benchmarks/tp_recorded.json
"""
from __future__ import annotations

import json
import sys


def tables(r: dict) -> str:
    ms = 1e3
    ar = r["all_reduce"]
    f = ar["fit"]
    w = r["worlds"]["2"]
    c = w["crossover"]
    L = []
    L.append(f"**The all-reduce alone** (2 gloo ranks over loopback, 1 thread each, a barrier before every call, sizes "
             f"interleaved, medians of {len(ar['rows'][0]['times_s'])}). Fit of the napkin's form "
             f"t = alpha + 2(W-1)/W * bytes / link, least squares on relative error: "
             f"**alpha {f['alpha_s'] * ms:.3f} ms, link {f['link_bytes_per_s'] / 1e9:.2f} GB/s**. "
             f"Worst measured/fitted ratio {ar['worst_ratio']:.2f} ({'within' if ar['within_2x'] else 'NOT within'} 2x).")
    L.append("")
    L.append("| floats | bytes | measured median (ms) | fitted napkin (ms) | measured / napkin |")
    L.append("|---:|---:|---:|---:|---:|")
    for a in ar["rows"]:
        L.append(f"| {a['floats']:,} | {a['bytes']:,} | {a['median_s'] * ms:.3f} | {a['predicted_s'] * ms:.3f} | {a['measured_over_fit']:.2f} |")
    L.append("")
    L.append(f"**One batch-1 decode step** ({r['context']} cached tokens, fp32, `KVCache` of each rank's model), medians of "
             f"{r['repeats']} interleaved rounds, ms. The sweep: random weights, {r['layers']} layers, heads of 64, MLP ~8/3 D, "
             "vocabulary 256. TP = 1 on 1 thread runs on rank 0 while rank 1 waits in a barrier (no CPU); TP = 1 on 2 threads "
             "likewise; TP = 2 is 2 ranks of 1 thread. Napkin: `roofline.tensor_parallel_napkin` with the read bandwidth "
             "measured at 1 thread on a buffer of one rank's bytes, the fitted alpha and link; \"shared\" is the same napkin with "
             "the bandwidth a rank got while both ranks read at once. \"all-reduces\" is the time the split step spent inside its "
             "all-reduces (the wait for the slower rank included).")
    L.append("")
    L.append("| model | D | TP=1, 1 thread | napkin | TP=1, 2 threads | napkin (2-thread bw) | TP=2 | napkin | napkin, shared | all-reduces | napkin comm | TP=2 / TP=1 (1 thread) |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in w["steps"]:
        p = s["predicted"]
        L.append(f"| {s['name']} | {s['dim']} | {s['tp1_1thread_s'] * ms:.2f} | {p['tp1_1thread_s'] * ms:.2f} | "
                 f"{s['tp1_wthreads_s'] * ms:.2f} | {p['tp1_wthreads_s'] * ms:.2f} | {s['tp_s'] * ms:.2f} | {p['tp_s'] * ms:.2f} | "
                 f"{p['tp_shared_memory_s'] * ms:.2f} | {s['tp_allreduces_s'] * ms:.2f} | {p['tp_comm_s'] * ms:.2f} | {s['split_over_whole']:.2f} |")
    L.append("")
    def fmt(v):
        return "none" if v is None else f"D ~ {v:.0f}"
    L.append("**The crossover** (TP = 2 at 1 thread per rank against TP = 1 on 1 thread): "
             f"measured {fmt(c['measured_dim'])} ({c['measured_reason']}); the napkin with the fitted "
             f"alpha and link and, for the split, the bandwidth a rank got while both read at once: "
             f"{fmt(c['predicted_dim'])} ({c['predicted_reason']})"
             + ("" if c["measured_over_predicted"] is None else
                f"; measured / predicted = {c['measured_over_predicted']:.2f} "
                f"({'within' if c['within_2x'] else 'NOT within'} a factor of 2)") + ". "
             f"The napkin with every rank reading as fast as one core alone (lab 01's devices, each "
             f"its own memory): {fmt(c['predicted_dim_own_memory'])}. With the alpha the split step "
             f"paid ({c['in_step_alpha_s'] * ms:.2f} ms per all-reduce beyond its bytes): "
             f"{fmt(c['predicted_dim_as_seen'])}.")
    eq = w["equal_threads_wins"]
    L.append("")
    L.append("**Equal total threads**: TP = 2 beats TP = 1 on 2 threads at " + (", ".join(eq) if eq else "no width") + ".")
    L.append("")
    L.append("**Copies against split at equal cores** (2 processes of 1 thread, each decoding its own batch-1 stream at the same time, "
             "against one model split over the same 2):")
    L.append("")
    L.append("| model | copies tok/s (both) | split tok/s | copies / split throughput | copies ms/token | split ms/token | copies / split latency |")
    L.append("|---|---:|---:|---:|---:|---:|---:|")
    for cp in w["copies_vs_split"]:
        L.append(f"| {cp['name']} | {cp['copies_tok_s']:.1f} | {cp['split_tok_s']:.1f} | {cp['throughput_ratio']:.2f} | "
                 f"{cp['copies_latency_s'] * ms:.2f} | {cp['split_latency_s'] * ms:.2f} | {cp['latency_ratio']:.2f} |")
    return "\n".join(L)


if __name__ == "__main__":
    print(tables(json.load(open(sys.argv[1] if len(sys.argv) > 1 else
                                "benchmarks/tp_recorded.json"))))
