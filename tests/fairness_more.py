"""Honest submissions to labs 06, 08 and 09 in other styles (tests/test_fairness.py grades them):
NumPy where torch was shown, the trace drawn with Python's own random module, a scheduler written as a class over a deque, a distillation step
with a torch.optim optimizer of the student's own for a sanity check and a loss written out by
hand, linear attention written with einsum and a chunk length found by a search over powers of
two."""
from __future__ import annotations

from fairness_common import Honest

NUMPY_PERCENTILE = '''
import numpy as np

def percentile(values, p):
    if len(values) == 0:
        raise ValueError("percentile of an empty list")
    if not 0 <= p <= 100:
        raise ValueError(f"p must be in [0, 100], got {p}")
    return np.percentile(np.asarray(values, dtype=np.float64), p)     # linear by default

def latencies(seq):
    n = seq.num_output_tokens
    return {"ttft": seq.first_token_time - seq.arrival_time,
            "tpot": (seq.finish_time - seq.first_token_time) / (n - 1) if n > 1 else 0.0,
            "e2e": seq.finish_time - seq.arrival_time}
'''

SCHEDULER_CLASS = '''
from collections import deque
from itertools import islice

def simulate_static(output_lens, max_batch):
    steps, ids = [], iter(range(len(output_lens)))
    while batch := list(islice(ids, max_batch)):
        for s in range(max(output_lens[i] for i in batch)):
            steps.append([i for i in batch if output_lens[i] > s])
    return steps

class Scheduler:
    """Iteration-level scheduling: join before a step, leave after it."""
    def __init__(self, output_lens, max_batch):
        self.left = list(output_lens)
        self.waiting = deque(range(len(output_lens)))
        self.running = []
        self.max_batch = max_batch

    def step(self):
        while self.waiting and len(self.running) < self.max_batch:
            self.running.append(self.waiting.popleft())
        batch = sorted(self.running)
        for i in self.running:
            self.left[i] -= 1
        self.running = [i for i in self.running if self.left[i] > 0]
        return batch

    def done(self):
        return not self.waiting and not self.running

def simulate_continuous(output_lens, max_batch):
    sched = Scheduler(output_lens, max_batch)
    steps = []
    while not sched.done():
        steps.append(sched.step())
    return steps
'''

KL_BY_HAND = '''
def distillation_loss(student_logits, teacher_logits, temperature=1.0):
    if not temperature > 0:
        raise ValueError("the temperature must be positive")
    V = student_logits.size(-1)
    s = (student_logits.float() / temperature).reshape(-1, V)
    t = (teacher_logits.float() / temperature).reshape(-1, V)
    p_t = torch.softmax(t, -1)
    kl = (p_t * (torch.log_softmax(t, -1) - torch.log_softmax(s, -1))).sum(-1)
    return kl.mean() * temperature * temperature

# my own check that the loss trains: a few Adam steps on a toy student reach the teacher
_toy = torch.nn.Parameter(torch.zeros(2, 5))
_target = torch.randn(2, 5)
_opt = torch.optim.Adam([_toy], lr=0.1)
for _ in range(200):
    _opt.zero_grad()
    distillation_loss(_toy, _target).backward()
    _opt.step()
assert distillation_loss(_toy, _target).item() < 1e-3
'''

EINSUM_ATTENTION = '''
def la_parallel(q, k, v, decay):
    T = q.size(-2)
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    pos = torch.arange(T)
    age = (pos.view(-1, 1) - pos.view(1, -1)).to(q.dtype)
    gamma = torch.as_tensor(decay, dtype=q.dtype).view(-1, 1, 1)
    mask = torch.where(age >= 0, gamma ** age.clamp(min=0), torch.zeros((), dtype=q.dtype))
    scores = torch.einsum("bhtd,bhsd->bhts", phi_q, phi_k) * mask
    return torch.einsum("bhts,bhsd->bhtd", scores, v) / (scores.sum(-1, keepdim=True) + EPS)
'''

STDLIB_RANDOM = '''
import math
import random
from itertools import accumulate

def _rng(generator):
    """Python's own generator, seeded from the torch generator given (same seed, same draws)."""
    return random.Random(int(torch.randint(0, 2**62, (1,), generator=generator)))

def poisson_arrivals(n, rate, generator):
    if not 0 < rate < math.inf:
        raise ValueError(f"rate must be positive and finite, got {rate}")
    rng = _rng(generator)
    return list(accumulate(rng.expovariate(rate) for _ in range(n)))

def lognormal_lengths(n, median, sigma, max_len, generator):
    rng = _rng(generator)
    return [min(max_len, max(1, round(rng.lognormvariate(math.log(median), sigma))))
            for _ in range(n)]
'''

SHORTEST_PROMPT_FIRST = '''
def my_policy(now, waiting, running, max_seqs):
    # whole prompts, but a free seat goes to the shortest waiting prompt (oldest on ties)
    plan = {q.id: (q.prompt_len - q.prefilled) or 1 for q in running}
    free = max_seqs - len(running)
    for q in sorted(waiting, key=lambda q: (q.prompt_len, q.arrival_time))[:free]:
        plan[q.id] = q.prompt_len
    return plan
'''

SEARCH_PLAN = '''
def pruning_plan(imp, layer_loss, budget):
    # a search: for each head count, the most neurons that fit; keep the candidate whose pruned
    # model (my prune_model) has the lowest loss on one calibration batch
    best = None
    for n_heads in range(2, target.config.n_heads + 1):
        for hidden in range(target.config.hidden_dim, 0, -16):
            shape = replace(target.config, n_heads=n_heads, n_kv_heads=None, hidden_dim=hidden)
            if shape.num_params() <= budget:
                keep = pruning.choose(imp, n_heads=n_heads, hidden_dim=hidden)
                loss = pruning.lm_loss(prune_model(target, keep), CALIB[:1])
                if best is None or loss < best[0]:
                    best = (loss, keep)
                break
    return best[1]
'''

POW2_CHUNK_SEARCH = '''
def choose_chunk(T, batch, n_heads, head_dim, machine):
    # a search over powers of two on my own estimate: a whole chunk's fixed costs for each of the
    # ceil(T / C) chunks, and the work of every token in a chunk of C (no short last chunk)
    work = batch * n_heads
    fixed = machine["per_chunk_us"] + machine["per_state_value_us"] * work * head_dim ** 2
    def estimate(C):
        arithmetic = T * work * (4 * head_dim * C + 4 * head_dim ** 2) / machine["flops_per_us"]
        return -(-T // C) * fixed + arithmetic + T * work * C * machine["per_score_us"]
    return min((2 ** i for i in range(20) if 2 ** i <= T), key=estimate)
'''

FIXED_BLOCKS = '''
class GrowingKVCache:
    """Fixed blocks of 64 positions that never move; the cache attends over them itself."""
    BLOCK = 64

    def __init__(self, n_layers, batch_size, n_kv_heads, head_dim, dtype=torch.float32, device="cpu"):
        self.shape = (batch_size, n_kv_heads, self.BLOCK, head_dim)
        self.dtype, self.device = dtype, device
        self.blocks = [[] for _ in range(n_layers)]     # per layer: [k block, v block] pairs
        self.seq_len = 0

    def update(self, layer_idx, k, v, positions):
        blocks, done = self.blocks[layer_idx], 0
        while done < k.shape[2]:
            b, off = divmod(self.seq_len + done, self.BLOCK)
            if b == len(blocks):
                blocks.append([torch.zeros(self.shape, dtype=self.dtype, device=self.device)
                               for _ in range(2)])
            n = min(k.shape[2] - done, self.BLOCK - off)
            blocks[b][0][:, :, off:off + n] = k[:, :, done:done + n]
            blocks[b][1][:, :, off:off + n] = v[:, :, done:done + n]
            done += n

    def attention(self, layer_idx, q, k, v, positions, window):
        # the model calls this instead of update: store, then attend block by block with a
        # running max and sum (the softmax of all blocks without putting them side by side)
        assert window is None, "no sliding windows here"
        self.update(layer_idx, k, v, positions)
        B, N, T, H = q.shape
        K = k.shape[1]
        q = q.reshape(B, K, N // K * T, H) / H ** 0.5              # query head h uses KV head h // (N/K)
        q_pos = positions.reshape(-1)[-T:].repeat(N // K)           # each query row's position
        end = self.seq_len + T
        m = torch.full((B, K, q.shape[2], 1), float("-inf"), dtype=q.dtype)
        s_sum = torch.zeros(B, K, q.shape[2], 1, dtype=q.dtype)
        acc = torch.zeros(B, K, q.shape[2], H, dtype=q.dtype)
        for b, (kb, vb) in enumerate(self.blocks[layer_idx]):
            lo, hi = b * self.BLOCK, min((b + 1) * self.BLOCK, end)
            if lo >= end:
                break
            scores = q @ kb[:, :, :hi - lo].transpose(-1, -2)
            future = torch.arange(lo, hi)[None, :] > q_pos[:, None]
            scores = scores.masked_fill(future, float("-inf"))
            m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
            p = torch.exp(scores - m_new)
            scale = torch.exp(m - m_new)
            s_sum = s_sum * scale + p.sum(-1, keepdim=True)
            acc = acc * scale + p @ vb[:, :, :hi - lo]
            m = m_new
        return (acc / s_sum).reshape(B, N, T, H)

    def advance(self, positions):
        self.seq_len += positions.shape[-1]

    @classmethod
    def for_model(cls, model, batch_size):
        c = model.config
        p = next(model.parameters())
        return cls(c.n_layers, batch_size, c.n_kv_heads, c.head_dim, p.dtype, p.device)
'''

# lab 02's measurement cells (part 4's demo and the growing cache's table; part 6-7's roof, TTFT,
# decode against the batch, the trace, the fits) skipped by the student: a minute of the batch that
# no autograded cell reads
LAB02_MEASUREMENTS = ('prompt_ids = tok.encode("JULIET:', "roof = phase_costs.cpu_roofline(",
                      "def forward_counts(", "prompt_lengths = [", "CONTEXT = 256", "P_TRACE, N_TRACE",
                      "# both phases in the same interleaved rounds", "# your cache in one greedy")


SHARDED_MODULE = '''
import torch
import torch.distributed as dist
import torch.nn.functional as F


class MyShardedBlock(torch.nn.Module):
    """One rank's heads and MLP columns as plain weight tensors; attention written out."""

    def __init__(self, block, rank, world):
        super().__init__()
        a, m = block.self_attn, block.mlp
        self.N, self.K, self.H = a.n_heads, a.n_kv_heads, a.head_dim
        if self.N % world or self.K % world and world % self.K or m.up_proj.out_features % world:
            raise ValueError(f"cannot split N={self.N}, K={self.K}, F={m.up_proj.out_features} "
                             f"over {world} ranks")
        self.nq = self.N // world
        group = self.N // self.K                                # query heads per KV head
        heads = range(rank * self.nq, (rank + 1) * self.nq)
        kv = sorted({h // group for h in heads})                # the KV heads my queries read
        self.kv_of = [kv.index(h // group) for h in heads]      # local KV index of each query
        rows = lambda hs: torch.cat([torch.arange(h * self.H, (h + 1) * self.H) for h in hs])
        q_rows, kv_rows = rows(heads), rows(kv)
        f = m.up_proj.out_features // world
        cols = slice(rank * f, (rank + 1) * f)
        P = lambda t: torch.nn.Parameter(t.detach().clone(), requires_grad=False)
        self.wq, self.wk, self.wv = P(a.q_proj.weight[q_rows]), P(a.k_proj.weight[kv_rows]), P(a.v_proj.weight[kv_rows])
        self.wo = P(a.o_proj.weight[:, q_rows])
        self.wg, self.wu, self.wd = P(m.gate_proj.weight[cols]), P(m.up_proj.weight[cols]), P(m.down_proj.weight[:, cols])
        self.n1, self.n2 = P(block.input_layernorm.weight), P(block.post_attention_layernorm.weight)
        self.eps = block.input_layernorm.eps

    def norm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def rope(self, x, cos, sin):
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    def forward(self, x, cos, sin, positions=None, cache=None):
        B, T, D = x.shape
        h = self.norm(x, self.n1)
        q = (h @ self.wq.T).view(B, T, self.nq, self.H).transpose(1, 2)
        k = (h @ self.wk.T).view(B, T, -1, self.H).transpose(1, 2)
        v = (h @ self.wv.T).view(B, T, -1, self.H).transpose(1, 2)
        q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
        k, v = k[:, self.kv_of], v[:, self.kv_of]
        o = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1)
        attn = o.transpose(1, 2).reshape(B, T, -1) @ self.wo.T
        dist.all_reduce(attn)
        x = x + attn
        h = self.norm(x, self.n2)
        mlp = (F.silu(h @ self.wg.T) * (h @ self.wu.T)) @ self.wd.T
        dist.all_reduce(mlp)
        return x + mlp


def shard_block(block, rank, world, group=None):
    return MyShardedBlock(block, rank, world)
'''

SUBMISSIONS = [
    # each design style shares a submission with another style of its lab: one graded notebook
    Honest("02_kv_cache", "fixed_blocks",
           "a growing KV cache unlike the solution's doubling: fixed blocks of 64 positions that "
           "never move, with the cache attending over them itself (an online softmax); the lab's "
           "measurement cells skipped (turned into comments)",
           {"02_growing_cache": FIXED_BLOCKS}, skip=LAB02_MEASUREMENTS),
    Honest("06_continuous_batching", "numpy_percentile_shortest_first",
           "percentile with NumPy's np.percentile, and a scheduling policy unlike the solution's: "
           "shortest prompt first, whole prompts",
           {"06_metrics": NUMPY_PERCENTILE, "06_policy": SHORTEST_PROMPT_FIRST}),
    Honest("06_continuous_batching", "stdlib_random",
           "the trace drawn with Python's random module seeded from the given generator, "
           "itertools.accumulate, comprehensions (the lab's trace cell runs these too)",
           {"06_workload": STDLIB_RANDOM}),
    Honest("06_continuous_batching", "scheduler_class",
           "a Scheduler class over a deque, itertools for the static batches",
           {"06_schedule": SCHEDULER_CLASS}),
    Honest("08_pruning_distillation", "kl_by_hand_search_plan",
           "the KL written out, checked with the student's own torch.optim.Adam loop, and a "
           "pruning plan found by a search over head counts on a calibration batch",
           {"08_kd_loss": KL_BY_HAND, "08_plan": SEARCH_PLAN}),
    Honest("09_beyond_attention", "einsum_attention_pow2_chunk",
           "linear attention written with einsum, and a chunk-length rule unlike the solution's "
           "formula: a search over powers of two on an estimate of the student's own",
           {"09_parallel": EINSUM_ATTENTION, "09_chunk_rule": POW2_CHUNK_SEARCH}),
    Honest("11_sharding", "weight_slices_direct_all_reduce",
           "a split block unlike the solution's column- and row-parallel layers in a copy of the "
           "block: one module holding the weight slices as its own parameters, the attention "
           "written out (its own norm, RoPE, KV heads picked per query head) and dist.all_reduce "
           "called directly, the group ignored",
           {"11_shard_block": SHARDED_MODULE}),
]
