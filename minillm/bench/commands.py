"""The `minillm bench ...` commands: each runs a harness of this package and prints its
figures (text, or one JSON object with --json). The parser is in minillm/cli.py."""
from __future__ import annotations

import json
import math

import torch


def report(a, result: dict, text) -> int:
    """Print a command's result: one JSON object with --json, else the text `text(result)`."""
    print(json.dumps(result) if a.json else text(result))
    return 0



def _load(name):
    import minillm
    return minillm.load(name), minillm.load_tokenizer(name)


def cmd_bench_decode(a) -> int:
    import minillm

    from .decode import DTYPES, bench_decode
    dtypes = a.dtype.split(",")
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise ValueError(f"--dtype takes a comma-separated list of {', '.join(DTYPES)}; got "
                         f"{a.dtype!r}")
    formats = {}
    for name in dtypes:                      # one format after the other, each interleaved
        model = minillm.load(a.model).to(DTYPES[name])
        formats[name] = bench_decode(
            model, prompt_len=a.prompt_len, new_tokens=a.new_tokens, batch=a.batch,
            naive=not a.no_naive, vs_hf=a.vs_hf, compile=a.compile,
            fused_step=not a.no_fused_step, repeats=a.repeats, seed=a.seed,
            threads=a.threads, cpu_time=a.cpu_time)

    def text(r):
        return "\n".join([f"model: {r['model']}"] + [
            f"{name}:\n" + "\n".join(f"{k:>32}: {v:.3f}" if isinstance(v, float)
                                      else f"{k:>32}: {v}" for k, v in f.items())
            for name, f in r["formats"].items()])
    return report(a, {"model": a.model, "formats": formats}, text)


def _tokens_match(t: dict) -> str:
    where = "match fp32" if t["matches_fp32"] else f"part from fp32 at {t['first_divergence']}"
    return f", greedy tokens {where}, top-1 agreement {t['top1_agreement']:.3f}"


def cmd_bench_quant(a) -> int:
    from ..data import load_text
    from .quant import bench_quant
    model, tok = _load(a.model)
    prompt = tok.encode(load_text("val")[:20 * a.prompt_len])[:a.prompt_len]
    if len(prompt) < a.prompt_len:
        raise ValueError(f"--prompt-len {a.prompt_len}: the validation text's start gives only "
                         f"{len(prompt)} tokens")
    r = {"model": a.model, **bench_quant(model, prompt, new_tokens=a.new_tokens,
                                         repeats=a.repeats, group_size=a.group_size,
                                         threads=a.threads, compiled=a.step == "compiled")}
    return report(a, r, lambda r: "\n".join(
        [f"{r['model']}, {r['step']} step, batch 1, {r['threads']} thread(s), "
         f"{r['new_tokens']} tokens after a "
         f"{r['prompt_len']}-token prompt; reads at {r['read_gb_s']:.1f} GB/s"] +
        [f"{n:>5}: {r[f'{n}_tok_s']:7.1f} tok/s"
         + (f" = {r[f'{n}_vs_fp32']:.2f}x fp32" if n != "fp32" else " (baseline)   ")
         + f", stores {r['model_bytes'][n] / 1e6:5.1f} MB, reads {r['bytes_per_token'][n] / 1e6:5.1f}"
         f" MB/token, {r['bandwidth_fraction'][n]:.2f} of its limit"
         + ("" if n == "fp32" else _tokens_match(r["tokens_match"][n]))
         for n in ("fp32", "bf16", "int8", "int4")]))


def cmd_bench_speculative(a) -> int:
    import minillm

    from .speculative import bench_speculative, repetitive_prompt
    target, draft = minillm.load(a.model), minillm.load(a.draft)
    tok = minillm.load_tokenizer(a.model)
    prompt = tok.encode(a.prompt)
    if not prompt:
        raise ValueError("the prompt is empty: give at least one character")
    ks = [int(k) for k in a.k.split(",")]
    r = {"model": a.model, "draft": a.draft,
         **bench_speculative(target, draft, prompt, ks, a.new_tokens, a.repeats,
                             lookup_prompt=None if a.no_lookup else repetitive_prompt(tok),
                             lookup_k=a.lookup_k, lookup_new_tokens=a.lookup_new_tokens,
                             cpu_time=a.cpu_time, draft_engine=a.draft_engine,
                             sample_temperature=a.temperature or None, sample_k=a.sample_k,
                             predict=not a.no_predict)}
    return report(a, r, lambda r: "\n".join(
        [f"target alone: {r['target_tok_s']:.1f} tok/s (its step at "
         f"{r['target_step_bandwidth_fraction']:.2f} of the {r['limit_tok_s']:.0f} tok/s "
         f"bandwidth limit; the best k at {r['speculative_vs_limit']:.2f} of it); draft/target "
         f"step cost c = {r['c']:.3f}"] +
        [f"{row['drafter']:>13} k={row['k']}: alpha {row['alpha']:.2f}, "
         f"{row['tokens_per_step']:.2f} tokens/step"
         + (f" (formula {row['predicted_tokens_per_step']:.2f})"
            if "predicted_tokens_per_step" in row else "")
         + f", speed-up {row['speedup']:.2f}x"
         + (f", exact {row['exact_greedy']}" if "exact_greedy" in row else
            f" at temperature {row['temperature']}") for row in r["runs"]]))


def cmd_bench_batching(a) -> int:
    import minillm

    from .batching import bench_batching
    model = minillm.load(a.model)
    r = {"model": a.model,
         **bench_batching(model, num_requests=a.requests, rate=a.rate, seed=a.seed,
                          max_batch=a.max_batch, block_size=a.block_size,
                          threads=1 if a.threads is None else a.threads)}
    return report(a, r, lambda r: (
        f"{r['requests']} requests ({r['completed']} completed): static "
        f"{r['static_tok_s']:.1f} tok/s, continuous {r['continuous_tok_s']:.1f} tok/s "
        f"({r['speedup']:.2f}x); p50 TTFT {r['static_ttft_p50_s']:.2f} s vs "
        f"{r['continuous_ttft_p50_s']:.2f} s"))


def cmd_bench_tp(a) -> int:
    from .tp import WIDTHS, bench_tp, text
    r = bench_tp(a.model, widths=a.widths or WIDTHS, layers=a.layers, context=a.context,
                 repeats=a.repeats, quick=a.quick)
    return report(a, r, text)


# the figures of a load_test summary that `bench serve` takes the median of across rounds
_SERVE_KEYS = ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "itl_p50_s", "itl_p99_s",
               "throughput_tok_s")


def _parse_rates(text: str) -> list[float]:
    try:
        rates = [float(r) for r in text.split(",")]
    except ValueError:
        rates = []
    if not rates or not all(math.isfinite(r) and r > 0 for r in rates):
        raise ValueError(f"--rates takes a comma-separated list of request rates > 0 (requests "
                         f"per second), e.g. 2,4,8; got {text!r}")
    return rates


def _probe_server(url: str) -> tuple[str, int]:
    """(model id, context) of the OpenAI-style server at `url`, or a ValueError saying why not."""
    import httpx
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--url must start with http:// or https://, got {url!r}")
    url = url.rstrip("/")
    try:
        health = httpx.get(url + "/health", timeout=5.0)
        models = httpx.get(url + "/v1/models", timeout=5.0)
        models.raise_for_status()
        info = models.json()["data"][0]
    except httpx.HTTPError as e:
        raise ValueError(f"cannot reach a minillm server at {url} ({type(e).__name__}: {e}); "
                         f"start one with `minillm serve --port 0`, or leave out --url to let "
                         f"the bench start its own") from e
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise ValueError(f"{url}/v1/models did not answer like an OpenAI-compatible server: "
                         f"{e!r}") from e
    if health.status_code != 200:
        raise ValueError(f"the server at {url} is not healthy: GET /health answered "
                         f"{health.status_code} {health.text[:200]!r}")
    return info["id"], int(info.get("max_model_len") or 0)


def _median_summary(runs: list[dict]) -> dict:
    """Median of each latency figure across rounds; completed and errors summed."""
    from ..serving.metrics import percentile
    out = {"completed": sum(r["completed"] for r in runs),
           "requests": sum(r["requests"] for r in runs),
           "errors": sum(r["errors"] for r in runs)}
    for k in _SERVE_KEYS:
        xs = [r[k] for r in runs if k in r]
        out[k] = percentile(xs, 50) if xs else None
    return out


def cmd_bench_serve(a) -> int:
    from .load_gen import Workload, load_test
    rates = _parse_rates(a.rates)
    for name in ("requests", "prompt_len", "max_tokens", "max_num_seqs", "long_prompt_len",
                 "long_every", "chunk", "rounds"):
        if getattr(a, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if not a.duration > 0 or not a.chunk_rate > 0:
        raise ValueError(f"--duration and --chunk-rate must be > 0, got {a.duration} and "
                         f"{a.chunk_rate}")
    if a.url is None and a.chunk < a.max_num_seqs:
        raise ValueError(f"--chunk {a.chunk} must be >= --max-num-seqs {a.max_num_seqs}: a "
                         f"chunked step first gives each running sequence its decode token")
    url = served = None
    if a.url is not None:                    # someone else's server: the sweep only
        url = a.url.rstrip("/")
        served, ctx = _probe_server(url)
    import minillm

    from ..data import load_tokens
    tok = minillm.load_tokenizer(a.model)    # with --url: only the prompts' tokenizer
    ids = load_tokens(tok, "val").tolist()
    model = None
    if url is None:
        model = minillm.load(a.model)
        ctx = model.config.max_seq_len
    if ctx and a.prompt_len + a.max_tokens > ctx:
        raise ValueError(f"--prompt-len {a.prompt_len} + --max-tokens {a.max_tokens} exceeds the "
                         f"model's context of {ctx} tokens")
    if url is None and a.long_prompt_len + 1 > ctx:
        raise ValueError(f"--long-prompt-len {a.long_prompt_len} + 1 output token exceeds the "
                         f"model's context of {ctx} tokens")

    def workload(rate, seed, long=False, **kw):
        return Workload(**{**dict(rate=rate, num_requests=a.requests, prompt_len=a.prompt_len,
                                  max_tokens=a.max_tokens, seed=seed, timeout_s=a.duration,
                                  long_prompt_len=a.long_prompt_len if long else None,
                                  long_every=a.long_every), **kw})

    threads = None if url else (1 if a.threads is None else a.threads)
    settings = {"rates": rates, "requests": a.requests, "prompt_len": a.prompt_len,
                "max_tokens": a.max_tokens, "duration_s": a.duration, "seed": a.seed,
                "max_num_seqs": None if url else a.max_num_seqs}
    result = {"model": served or a.model, "url": url, "threads": threads, "settings": settings}
    if url is not None:
        result["sweep"] = [load_test(url, served, workload(r, a.seed), ids) for r in rates]
        result["chunked"] = None
        return report(a, result, _bench_serve_text)

    from ..serving.server import BackgroundServer
    settings.update(long_prompt_len=a.long_prompt_len, long_every=a.long_every, chunk=a.chunk,
                    chunk_rate=a.chunk_rate, rounds=a.rounds)
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    servers = {}
    try:
        for name, budget in (("unchunked", None), ("chunked", a.chunk)):
            srv = servers[name] = BackgroundServer(model, tok, a.model,
                                                   max_num_seqs=a.max_num_seqs,
                                                   max_batched_tokens=budget)
            # warm-up, untimed: a short and a long prompt through the fresh engine
            load_test(srv.url, a.model, workload(50.0, a.seed, long=True, num_requests=2,
                                                 long_every=2, max_tokens=2), ids)
        # (1) the rate sweep: one server, whole-prompt prefill, the short workload
        result["sweep"] = [load_test(servers["unchunked"].url, a.model, workload(r, a.seed), ids)
                           for r in rates]
        # (2) chunked prefill under long prompts: both servers up, runs interleaved (ABBA...)
        runs = {"unchunked": [], "chunked": []}
        for i in range(a.rounds):
            w = workload(a.chunk_rate, a.seed + i, long=True)
            order = ("unchunked", "chunked") if i % 2 == 0 else ("chunked", "unchunked")
            for name in order:
                runs[name].append(load_test(servers[name].url, a.model, w, ids))
    finally:
        for srv in servers.values():
            srv.stop()
        torch.set_num_threads(old_threads)
    med = {name: _median_summary(rs) for name, rs in runs.items()}

    def ratio(k):
        u, c = med["unchunked"][k], med["chunked"][k]
        return u / c if u is not None and c else None
    result["chunked"] = {
        "rate": a.chunk_rate, "rounds": a.rounds, "chunk": a.chunk,
        "long_prompt_len": a.long_prompt_len, "long_every": a.long_every, **med,
        "itl_p99_ratio": ratio("itl_p99_s"), "tpot_p99_ratio": ratio("tpot_p99_s"),
        "ttft_p99_ratio": ratio("ttft_p99_s"), "runs": runs}
    return report(a, result, _bench_serve_text)


def _bench_serve_text(r: dict) -> str:
    def f(v, fmt=".3f"):
        return "-" if v is None else format(v, fmt)
    s = r["settings"]
    where = r["url"] or f"its own servers on loopback, {r['threads']} torch thread(s), " \
                        f"max_num_seqs {s['max_num_seqs']}"
    lines = [f"bench serve: {r['model']} at {where}",
             f"rate sweep ({s['requests']} requests per rate, {s['prompt_len']}-token prompts, "
             f"{s['max_tokens']} tokens out):",
             f"{'req/s':>7}{'done':>7}{'errors':>7}{'tok/s':>8}{'TTFT p50':>10}{'p99':>8}"
             f"{'TPOT p50':>10}{'p99':>8}{'ITL p99':>9}  (seconds)"]
    for x in r["sweep"]:
        lines.append(f"{x['rate']:>7g}{x['completed']:>4}/{x['requests']:<2}{x['errors']:>7}"
                     f"{f(x.get('throughput_tok_s'), '.1f'):>8}{f(x.get('ttft_p50_s')):>10}"
                     f"{f(x.get('ttft_p99_s')):>8}{f(x.get('tpot_p50_s')):>10}"
                     f"{f(x.get('tpot_p99_s')):>8}{f(x.get('itl_p99_s')):>9}")
        if x["errors"]:
            lines.append(f"{'':>7}errors: {'; '.join(x['error_examples'])}")
    c = r["chunked"]
    if c is not None:
        lines += [f"chunked prefill at {c['rate']:g} req/s, 1 prompt in {c['long_every']} of "
                  f"{c['long_prompt_len']} tokens (1 out), medians of {c['rounds']} interleaved "
                  f"rounds (short requests only):",
                  f"{'':>16}{'TTFT p50':>10}{'p99':>8}{'TPOT p50':>10}{'p99':>8}{'ITL p50':>9}"
                  f"{'p99':>8}{'errors':>8}"]
        for name, label in (("unchunked", "whole prompts"), ("chunked", f"chunks of {c['chunk']}")):
            m = c[name]
            lines.append(f"{label:>16}{f(m['ttft_p50_s']):>10}{f(m['ttft_p99_s']):>8}"
                         f"{f(m['tpot_p50_s']):>10}{f(m['tpot_p99_s']):>8}{f(m['itl_p50_s']):>9}"
                         f"{f(m['itl_p99_s']):>8}{m['errors']:>8}")
        lines.append(f"whole / chunked: ITL p99 {f(c['itl_p99_ratio'], '.2f')}x, TPOT p99 "
                     f"{f(c['tpot_p99_ratio'], '.2f')}x, TTFT p99 {f(c['ttft_p99_ratio'], '.2f')}x")
    return "\n".join(lines)
