"""The serving engine (labs 06/07): outputs equal the plain cached loop, preemption loses nothing,
prefix sharing and forks share blocks, the lab 06 trace is served whole, static batching is a
faithful baseline, metrics and the trace generator are right, bad input is refused."""
import copy
import math

import pytest
import torch

from minillm.bench.batching import StepClock, replay
from minillm.config import ModelConfig
from minillm.generate import generate_cached
from minillm.model import Transformer
from minillm.sampling import SamplingParams
from minillm.serving import BlockManager, Sequence
from minillm.serving.attention_backend import PagedKVCache
from minillm.serving.engine import LLMEngine
from minillm.serving.metrics import percentile, request_latencies, summarize, timeline
from minillm.serving.model_runner import flatten_batch, last_rows
from minillm.serving.static_batching import StaticBatchServer
from minillm.serving.trace import lognormal_lengths, make_trace, poisson_arrivals, trace_summary

V = 61


def tiny(max_seq_len=96, **kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=V, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=48,
               max_seq_len=max_seq_len)
    cfg.update(kw)
    return Transformer(ModelConfig(**cfg)).eval()


@pytest.fixture(scope="module")
def model():
    return tiny()


def prompts(n, seed=0, lo=1, hi=30):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi, (n,), generator=g).tolist()
    return [torch.randint(0, V, (k,), generator=g).tolist() for k in lens]


def reference(model, ps, params):
    return [generate_cached(model, [p], sp)[0] for p, sp in zip(ps, params)]


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_engine_equals_the_cached_loop(model, temperature, one_thread):
    ps = prompts(7)
    params = [SamplingParams(temperature=temperature, top_k=20, max_new_tokens=5 + 4 * i,
                             seed=10 + i) for i in range(7)]
    eng = LLMEngine(model, block_size=4, max_num_seqs=3)
    assert eng.generate(ps, params) == reference(model, ps, params)
    assert eng.bm.num_free_blocks == eng.bm.num_blocks
    eng.bm.check_invariants()


def test_stop_ids_end_a_request_like_the_cached_loop(model):
    free = generate_cached(model, [3, 4, 5], SamplingParams(temperature=0, max_new_tokens=20))[0]
    p = SamplingParams(temperature=0, max_new_tokens=20, stop_ids=(free[6],))
    eng = LLMEngine(model, block_size=4)
    assert eng.generate([[3, 4, 5]], p) == [generate_cached(model, [3, 4, 5], p)[0]]
    assert eng.sequences[0][0].finish_reason == "stop"


def test_steps_mix_prefills_and_decodes_in_one_forward(model):
    """Selective batching: one forward call per step, prefill and decode tokens together."""
    eng = LLMEngine(model, block_size=4, max_num_seqs=4)
    eng.add_request([1, 2, 3], SamplingParams(temperature=0, max_new_tokens=6))
    eng.step()                                              # prefill of request 0
    eng.add_request([4, 5, 6, 7, 8], SamplingParams(temperature=0, max_new_tokens=6))
    eng.step()                                              # decode 0 + prefill 1
    assert eng.steps[1].runs == [(0, 0, 1), (1, 1, 5)]
    assert eng.runner.forward_calls == 2 and eng.runner.tokens_run == 3 + 1 + 5


def test_flatten_batch_and_last_rows():
    a, b = Sequence(0, [1, 2, 3, 4], 4), Sequence(1, [5, 6, 7], 2)
    b.num_cached_tokens = 2
    ids, pos, lens = flatten_batch([a, b])
    assert ids == [1, 2, 3, 4, 7] and pos == [0, 1, 2, 3, 2] and lens == [4, 1]
    assert last_rows(lens) == [3, 4]


def test_preemption_under_a_tiny_block_budget_loses_nothing(model, one_thread):
    ps = prompts(8, seed=3, lo=5, hi=20)
    params = [SamplingParams(temperature=0.8, max_new_tokens=30, seed=i) for i in range(8)]
    eng = LLMEngine(model, num_blocks=14, block_size=4, max_num_seqs=8)
    out = eng.generate(ps, params)
    assert eng.scheduler.num_preemptions > 0
    assert out == reference(model, ps, params)
    assert all(len(o) == 30 for o in out)
    assert eng.bm.num_free_blocks == eng.bm.num_blocks
    eng.bm.check_invariants()


def test_prefix_caching_skips_the_shared_system_prompt(model):
    system = list(range(1, 25))                              # 6 full blocks of 4
    ps = [system + [30 + i, 31] for i in range(4)]
    params = SamplingParams(temperature=0, max_new_tokens=8)
    runs = {}
    for caching in (False, True):
        eng = LLMEngine(model, block_size=4, max_num_seqs=1, enable_prefix_caching=caching)
        out = eng.generate(ps, params)
        assert out == reference(model, ps, [params] * 4)
        runs[caching] = eng.runner.tokens_run
        if caching:
            assert eng.bm.num_prefix_hits == 3 * 6           # requests 2..4 reuse 6 blocks
    assert runs[False] - runs[True] == 3 * 24


def test_parallel_sampling_forks_and_copies_on_write(model):
    p = SamplingParams(temperature=1.0, max_new_tokens=12, seed=5)
    prompt = list(range(1, 11))                              # 10 tokens: last block partial
    eng = LLMEngine(model, block_size=4)
    rid = eng.add_request(prompt, p, n=3)
    eng.step()                                               # prefill once, fork, sample x3
    tables = [eng.bm.block_table(s) for s in eng.sequences[rid]]
    assert tables[0] == tables[1] == tables[2]
    assert [eng.bm.blocks[b].ref_count for b in tables[0]] == [3, 3, 3]
    eng.step()                                               # two of the three copy the block
    tables = [eng.bm.block_table(s) for s in eng.sequences[rid]]
    assert tables[0][:2] == tables[1][:2] == tables[2][:2]
    assert len({t[2] for t in tables}) == 3
    while eng.has_unfinished():
        eng.step()
    want = [generate_cached(model, [prompt], SamplingParams(temperature=1.0, max_new_tokens=12,
                                                            seed=5 + i))[0] for i in range(3)]
    assert eng.outputs(rid) == want
    assert eng.runner.tokens_run == 10 + 3 * 11             # the prompt ran once
    assert eng.bm.num_free_blocks == eng.bm.num_blocks


@pytest.mark.parametrize("backend", ["torch", "triton",
                                     pytest.param("triton-split", marks=pytest.mark.slow)])
def test_attention_backends_agree(model, backend):
    """The slot writes and the decode half through each backend: torch (the kernels' plain-torch
    reference, the CPU default) and the Triton kernels (CPU interpreter here, set by conftest;
    compiled, with the model and its paged cache on the GPU, where there is one). The reference
    engine always runs on the CPU."""
    on_gpu = backend.startswith("triton") and torch.cuda.is_available()
    if backend.startswith("triton"):
        pytest.importorskip("triton")
    ps = prompts(5, seed=7)
    params = [SamplingParams(temperature=0, max_new_tokens=10)] * 5
    served = copy.deepcopy(model).cuda() if on_gpu else model
    eng = LLMEngine(served, block_size=4, max_num_seqs=3, backend=backend)
    assert eng.device.type == ("cuda" if on_gpu else "cpu")
    assert eng.generate(ps, params) == reference(model, ps, params)


def test_paged_cache_refuses_models_it_cannot_store():
    m = tiny()
    m.layers[0].self_attn.window = 8
    with pytest.raises(ValueError, match="sliding"):
        PagedKVCache.for_model(m, 4, 4, backend="torch")
    with pytest.raises(ValueError, match="unknown attention backend"):
        PagedKVCache.for_model(tiny(), 4, 4, backend="cuda-magic")
    if not torch.cuda.is_available():
        with pytest.MonkeyPatch.context() as mp:
            mp.delenv("TRITON_INTERPRET", raising=False)
            with pytest.raises(ValueError, match="CUDA"):
                PagedKVCache.for_model(tiny(), 4, 4, backend="triton")


# ---- the lab 06 workload --------------------------------------------------------------------
@pytest.fixture(scope="module")
def ctx_model():
    return tiny(max_seq_len=512)


def test_lab06_trace_is_served_whole_by_both_servers(ctx_model, one_thread):
    trace = make_trace(40, rate=200.0, seed=1, vocab_size=V, prompt_max=128, output_max=128)
    served = {}
    for kind in ("static", "continuous"):
        clock = StepClock()        # deterministic: overlap set by the trace, not the machine
        if kind == "static":
            server = StaticBatchServer(ctx_model, max_batch=8, clock=clock)
        else:                                   # a tight KV budget: preemptions must happen
            server = LLMEngine(ctx_model, num_blocks=24, block_size=16, max_num_seqs=8,
                               clock=clock)
        replay(server, trace, clock)
        seqs = server.all_sequences()
        assert len(seqs) == 40 and all(s.is_finished for s in seqs)
        assert [s.num_output_tokens for s in seqs] == [r.max_new_tokens for r in trace]
        m = summarize(seqs)
        assert m["completed"] == m["requests"] == 40
        assert m["output_tokens"] == trace_summary(trace)["output_tokens"]
        served[kind] = server
    eng = served["continuous"]
    assert eng.scheduler.num_preemptions > 0
    assert eng.bm.num_used_blocks == 0
    eng.bm.check_invariants()
    static_out = [s.output_ids for s in served["static"].all_sequences()]
    assert static_out == [s.output_ids for s in eng.all_sequences()]        # same greedy tokens


def test_static_batching_counts_its_padded_slots_exactly(model):
    srv = StaticBatchServer(model, max_batch=3)
    lens, outs = [2, 7, 4], [3, 9, 1]
    for k, o in zip(lens, outs):
        srv.add_request(list(range(1, k + 1)), SamplingParams(temperature=0, max_new_tokens=o))
    while srv.has_unfinished():
        srv.step()
    assert len(srv.steps) == max(outs)                      # one prefill + (max - 1) decodes
    assert srv.token_slots == 3 * max(lens) + 3 * (max(outs) - 1)
    assert srv.useful_tokens == sum(lens) + sum(o - 1 for o in outs)
    got = [s.output_ids for s in srv.all_sequences()]
    want = [generate_cached(model, [list(range(1, k + 1))],
                            SamplingParams(temperature=0, max_new_tokens=o))[0]
            for k, o in zip(lens, outs)]
    assert got == want                                      # the padding is masked


def test_continuous_admits_while_a_long_request_runs(model):
    """Iteration-level scheduling: a short request that arrives during a long one finishes
    first; under static batching it waits for the long one."""
    finish = {}
    for kind in ("static", "continuous"):
        server = (StaticBatchServer(model, max_batch=4) if kind == "static"
                  else LLMEngine(model, block_size=4, max_num_seqs=4))
        server.add_request([1, 2], SamplingParams(temperature=0, max_new_tokens=40))
        server.step()
        server.add_request([3, 4], SamplingParams(temperature=0, max_new_tokens=3))
        order = []
        while server.has_unfinished():
            order += [s.request_id for s in server.step()]
        finish[kind] = order
    assert finish == {"static": [0, 1], "continuous": [1, 0]}


# ---- metrics and trace ----------------------------------------------------------------------
def test_percentile_interpolates_like_numpy():
    np = pytest.importorskip("numpy")
    xs = [3.0, 1.0, 7.5, 2.0, 10.0, 4.0, 4.0]
    for p in (0, 10, 50, 90, 99, 100):
        assert percentile(xs, p) == pytest.approx(float(np.percentile(xs, p)))
    with pytest.raises(ValueError, match="empty"):
        percentile([], 50)


def test_latencies_of_one_request():
    s = Sequence(0, [1, 2], 2, SamplingParams(max_new_tokens=3), arrival_time=1.0)
    for t, tok in ((1.5, 7), (1.7, 8), (2.1, 9)):
        s.append_token(tok, t)
    s.finish_time = 2.1
    lat = request_latencies(s)
    assert lat["ttft"] == pytest.approx(0.5) and lat["e2e"] == pytest.approx(1.1)
    assert lat["tpot"] == pytest.approx(0.3) and lat["output_tokens"] == 3
    m = summarize([s])
    assert m["throughput_tok_s"] == pytest.approx(3 / 1.1) and m["ttft_p99_s"] == pytest.approx(0.5)


def test_timeline_lists_every_request_in_every_step(model):
    eng = LLMEngine(model, block_size=4)
    eng.generate([[1, 2, 3], [4]], SamplingParams(temperature=0, max_new_tokens=2))
    assert timeline(eng.steps) == [(0, 0, 3), (0, 1, 1), (1, 0, 1), (1, 1, 1)]


def test_trace_is_seeded_poisson_and_heavy_tailed():
    a, b = make_trace(300, rate=50.0, seed=4), make_trace(300, rate=50.0, seed=4)
    assert a == b and a != make_trace(300, rate=50.0, seed=5)
    times = [r.arrival_time for r in a]
    assert times == sorted(times) and times[0] > 0
    g = torch.Generator().manual_seed(0)
    gaps = torch.tensor(poisson_arrivals(20000, 50.0, g)).diff()
    assert gaps.mean().item() == pytest.approx(1 / 50, rel=0.05)          # Exp(rate): mean 1/rate
    assert gaps.std().item() == pytest.approx(1 / 50, rel=0.05)           # and std 1/rate
    lens = lognormal_lengths(20000, 24, 1.0, 10 ** 6, g)
    assert percentile(lens, 50) == pytest.approx(24, rel=0.05)
    assert percentile(lens, 99) / 24 == pytest.approx(math.exp(2.326), rel=0.15)   # heavy tail
    assert all(1 <= len(r.prompt_ids) <= 256 and 1 <= r.max_new_tokens <= 256 for r in a)


def test_trace_refuses_what_cannot_fit():
    with pytest.raises(ValueError, match="context of 512"):
        make_trace(4, prompt_max=300, output_max=300)
    with pytest.raises(ValueError, match="rate"):
        make_trace(4, rate=0.0)


# ---- bad input ------------------------------------------------------------------------------
def test_engine_refuses_bad_requests_clearly(model):
    eng = LLMEngine(model, num_blocks=8, block_size=4)
    with pytest.raises(ValueError, match="empty"):
        eng.add_request([])
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 61\)"):
        eng.add_request([1, 61])
    with pytest.raises(ValueError, match="exceeds the model's context of 96"):
        eng.add_request([1] * 90, SamplingParams(max_new_tokens=10))
    with pytest.raises(ValueError, match="could never run"):
        eng.add_request([1] * 30, SamplingParams(max_new_tokens=10))
    with pytest.raises(ValueError, match="n .samples per prompt"):
        eng.add_request([1], n=0)
    with pytest.raises(ValueError, match="2 prompts but 1"):
        eng.generate([[1], [2]], [SamplingParams()])
    assert not eng.has_unfinished()
    static = StaticBatchServer(model, max_batch=2)
    for bad in ([1, 61], [-1, 2]):
        with pytest.raises(ValueError, match=r"token ids must be in \[0, 61\)"):
            static.add_request(bad)
    assert not static.has_unfinished()


def test_the_package_exports_the_engine():
    import minillm.serving as serving
    assert serving.LLMEngine is LLMEngine and serving.StaticBatchServer is StaticBatchServer
    assert BlockManager(4, 4).num_free_blocks == 4


# ---- the schedules predicted without a model ------------------------------------------------
def test_simulated_schedules_match_the_real_servers(model):
    from minillm.serving.simulate import simulate_continuous, simulate_static, static_slots
    g = torch.Generator().manual_seed(9)
    outs = [1 + int(x) for x in torch.randint(0, 12, (11,), generator=g)]
    ps = prompts(11, seed=9)
    for kind, simulate in (("static", simulate_static), ("continuous", simulate_continuous)):
        server = (StaticBatchServer(model, max_batch=4) if kind == "static"
                  else LLMEngine(model, block_size=4, max_num_seqs=4))
        for p, o in zip(ps, outs):
            server.add_request(p, SamplingParams(temperature=0, max_new_tokens=o))
        while server.has_unfinished():
            server.step()
        real = [sorted(r for r, _, _ in rec.runs) for rec in server.steps]
        assert real == simulate(outs, 4), kind
        if kind == "static":
            slots = [static_slots([len(p) for p in ps[a:a + 4]], outs[a:a + 4])
                     for a in range(0, 11, 4)]
            assert server.token_slots == sum(s for s, _ in slots)
            assert server.useful_tokens == sum(u for _, u in slots)
    assert simulate_continuous([3, 1, 2], 2) == [[0, 1], [0, 2], [0, 2]]
    assert simulate_static([3, 1, 2], 2) == [[0, 1], [0], [0], [2], [2]]
    with pytest.raises(ValueError, match="output length"):
        simulate_static([0, 2], 2)


def test_step_records_count_the_tokens_each_step_ran(model):
    eng = LLMEngine(model, block_size=4)
    eng.generate([[1, 2, 3], [4]], SamplingParams(temperature=0, max_new_tokens=3))
    assert [r.tokens for r in eng.steps] == [4, 2, 2]
    srv = StaticBatchServer(model, max_batch=2)
    for p, o in (([1, 2, 3], 3), ([4], 1)):
        srv.add_request(p, SamplingParams(temperature=0, max_new_tokens=o))
    while srv.has_unfinished():
        srv.step()
    assert [r.tokens for r in srv.steps] == [6, 2, 2] and srv.token_slots == 10


def test_the_bench_trace_is_served_whole_under_a_tight_kv_budget(ctx_model, one_thread):
    """`minillm bench batching`'s default trace (128 requests), 32 seats but KV room for about
    a third of them: the scheduler must preempt, and still lose nothing and leak nothing."""
    from minillm.bench.batching import TRACE
    trace = make_trace(128, 200.0, 0, vocab_size=V, **TRACE)
    clock = StepClock()            # deterministic: overlap set by the trace, not the machine
    eng = LLMEngine(ctx_model, num_blocks=40, block_size=16, max_num_seqs=32, clock=clock)
    replay(eng, trace, clock)
    seqs = eng.all_sequences()
    assert [s.num_output_tokens for s in seqs] == [r.max_new_tokens for r in trace]
    assert all(s.is_finished and s.finish_reason == "length" for s in seqs)
    assert eng.scheduler.num_preemptions > 0
    assert eng.bm.num_used_blocks == 0 and not eng.bm.tables
    eng.bm.check_invariants()
    greedy = [generate_cached(ctx_model, [list(trace[i].prompt_ids)], trace[i].params())[0]
              for i in (0, 57, 127)]
    assert greedy == [seqs[i].output_ids for i in (0, 57, 127)]


def test_the_scheduler_alone_changes_the_block_manager():
    """nano-vllm's boundary: the engine reads the block manager but never allocates, appends,
    forks or frees blocks, nor edits the scheduler's queues; the scheduler owns both."""
    import inspect

    import minillm.serving.engine as engine_module
    src = inspect.getsource(engine_module)
    for touch in ("bm.fork(", "bm.allocate(", "bm.free(", "bm.append_slot(", "BlockManager(",
                  "scheduler.running", "scheduler.waiting"):
        assert touch not in src, f"the engine calls {touch}"


# ---- chunked prefill, the LM head on sampled rows only, seats for forks, abort (issue 17) ----
@pytest.mark.parametrize("budget", [5, 8, 13])
def test_chunked_prefill_equals_the_cached_loop(model, budget, one_thread):
    """Prompts longer than the step's token budget run in chunks; outputs do not change, and no
    step runs more tokens than the budget."""
    ps = prompts(6, seed=3, lo=10, hi=40)
    params = [SamplingParams(temperature=0.8, top_k=10, max_new_tokens=6, seed=i)
              for i in range(6)]
    eng = LLMEngine(model, block_size=4, max_num_seqs=4, max_num_batched_tokens=budget,
                    chunked_prefill=True)
    assert eng.generate(ps, params) == reference(model, ps, params)
    assert max(r.tokens for r in eng.steps) <= budget
    assert any(n > 1 and n < len(ps[0]) for r in eng.steps for _q, _s, n in r.runs)
    assert eng.runner.tokens_run == sum(map(len, ps)) + 6 * 5     # nothing computed twice
    assert eng.bm.num_free_blocks == eng.bm.num_blocks
    eng.bm.check_invariants()


def test_chunked_prefill_lets_decodes_run_beside_a_long_prompt(model):
    eng = LLMEngine(model, block_size=4, max_num_seqs=4, max_num_batched_tokens=8,
                    chunked_prefill=True)
    eng.add_request([1, 2, 3], SamplingParams(temperature=0, max_new_tokens=20))
    eng.step()
    eng.add_request(list(range(1, 41)), SamplingParams(temperature=0, max_new_tokens=2))
    for _ in range(5):                  # 40 tokens in chunks of 7, the decode in every step
        eng.step()
    assert [r.runs for r in eng.steps[1:]] == [[(1, 1, 7), (0, 0, 1)]] * 5
    seq0 = eng.sequences[0][0]
    assert seq0.num_output_tokens == 6 and eng.sequences[1][0].num_output_tokens == 0
    unchunked = LLMEngine(model, block_size=4, max_num_seqs=4)
    unchunked.add_request([1, 2, 3], SamplingParams(temperature=0, max_new_tokens=20))
    unchunked.step()
    unchunked.add_request(list(range(1, 41)), SamplingParams(temperature=0, max_new_tokens=2))
    unchunked.step()
    assert unchunked.steps[1].tokens == 41                   # the whole prompt in one step


def test_a_chunk_in_flight_is_not_reused_before_it_is_written(model, one_thread):
    """Prefix caching with chunks: a block is findable by hash only once a step writes it. A
    request aborted mid-prefill leaves its written blocks findable and nothing else, so the same
    prompt sent again reuses exactly those and recomputes the rest."""
    prompt = list(range(1, 33))                              # 8 full blocks of 4
    p = SamplingParams(temperature=0, max_new_tokens=3)
    eng = LLMEngine(model, block_size=4, max_num_seqs=4, max_num_batched_tokens=10,
                    chunked_prefill=True)
    eng.add_request(prompt, p)
    eng.step()                                               # 10 tokens: blocks 0, 1 written
    eng.abort(0)
    eng.add_request(prompt, p)
    eng.step()
    assert eng.bm.num_prefix_hits == 2
    while eng.has_unfinished():
        eng.step()
    assert eng.outputs(1) == [generate_cached(model, [prompt], p)[0]]
    eng.bm.check_invariants()


def test_the_lm_head_runs_only_on_sampled_rows(model):
    """One LM-head row per sampled token: none for prompt positions, none for a chunk that does
    not end its prompt."""
    rows = []
    h = model.lm_head.register_forward_hook(lambda m, inp, out: rows.append(out.shape[1]))
    try:
        eng = LLMEngine(model, block_size=4, max_num_seqs=4, max_num_batched_tokens=8,
                        chunked_prefill=True)
        eng.add_request(list(range(1, 20)), SamplingParams(temperature=0, max_new_tokens=3))
        eng.add_request([5, 6], SamplingParams(temperature=0, max_new_tokens=4))
        while eng.has_unfinished():
            eng.step()
    finally:
        h.remove()
    assert len(rows) == len(eng.steps)
    assert sum(rows) == 3 + 4
    assert rows[:2] == [0, 0]                                # 19 tokens: chunks of 8, 8, 3


def test_forked_samples_stay_within_max_num_seqs(model):
    eng = LLMEngine(model, block_size=4, max_num_seqs=4)
    p = SamplingParams(temperature=1.0, max_new_tokens=8, seed=1)
    eng.add_request([1, 2, 3], p, n=3)
    eng.add_request([4, 5, 6], p, n=3)               # waits: 3 + 3 seats > 4
    eng.add_request([7], p)
    most = 0
    while eng.has_unfinished():
        eng.step()
        most = max(most, len(eng.scheduler.running))
    assert most <= 4
    assert [len(eng.outputs(r)) for r in range(3)] == [3, 3, 1]
    with pytest.raises(ValueError, match="max_num_seqs"):
        eng.add_request([1], p, n=5)


def test_abort_frees_a_request_wherever_it_is(model):
    eng = LLMEngine(model, block_size=4, max_num_seqs=1, max_num_batched_tokens=8,
                    chunked_prefill=True)
    p = SamplingParams(temperature=0, max_new_tokens=30)
    running = eng.add_request(list(range(1, 30)), p, n=1)
    waiting = eng.add_request([1, 2], p, n=1)
    eng.step()                                               # request 0 mid-prefill
    assert eng.bm.num_used_blocks > 0
    assert [s.finish_reason for s in eng.abort(running)] == ["abort"]
    assert eng.bm.num_used_blocks == 0 and not eng.scheduler.running
    eng.step()
    eng.abort(waiting)
    assert not eng.has_unfinished() and eng.bm.num_free_blocks == eng.bm.num_blocks
    assert eng.abort(waiting) == []                          # twice is harmless
    with pytest.raises(KeyError):
        eng.abort(99)
    eng.bm.check_invariants()


def test_release_forgets_only_finished_requests(model):
    eng = LLMEngine(model, block_size=4)
    a = eng.add_request([1, 2, 3], SamplingParams(temperature=0, max_new_tokens=2))
    b = eng.add_request([4, 5], SamplingParams(temperature=0, max_new_tokens=9))
    eng.step()
    eng.step()
    with pytest.raises(ValueError, match="not finished"):
        eng.release(b)
    eng.release(a)
    assert a not in eng.sequences and eng.add_request([6], SamplingParams()) not in (a, b)
    with pytest.raises(KeyError):
        eng.release(a)


def test_trace_draws_with_the_generators_it_is_given():
    """Lab 06 builds its trace with the student's generators (the course's are withheld there):
    the same generators give the same trace, others give theirs."""
    assert make_trace(20, rate=50.0, seed=3, arrivals=poisson_arrivals,
                      lengths=lognormal_lengths) == make_trace(20, rate=50.0, seed=3)
    calls = []

    def lengths(n, median, sigma, max_len, generator):
        calls.append((n, median, sigma, max_len))
        return [min(max_len, int(median))] * n

    t = make_trace(5, rate=10.0, seed=0, prompt_median=7, output_median=3, output_max=9,
                   arrivals=lambda n, rate, g: [0.5 * (i + 1) for i in range(n)], lengths=lengths)
    assert [r.arrival_time for r in t] == [0.5, 1.0, 1.5, 2.0, 2.5]
    assert all(len(r.prompt_ids) == 7 and r.max_new_tokens == 3 for r in t)
    assert calls == [(5, 7, 0.8, 256), (5, 3, 1.0, 9)]
