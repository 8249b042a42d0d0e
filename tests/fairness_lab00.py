"""Honest lab 00 submissions in the styles students write (tests/test_fairness.py grades them).
Each entry replaces some answer cells of the notebook's own solution and may add cells of its
own; every one is correct, so every one must earn exactly the full automatic points."""
from __future__ import annotations

from fairness_common import Honest

LAB = "00_sampling"

OPTIM_SANITY = '''
def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    if temperature <= 0:
        raise ValueError("temperature must be > 0")
    return logits / temperature

# my own sanity check: learn the scale that temperature 2 applies, with torch.optim
w = torch.nn.Parameter(torch.tensor(0.0))
opt = torch.optim.SGD([w], lr=0.2)
for _ in range(100):
    opt.zero_grad()
    loss = ((torch.tensor([4.0]) * w - apply_temperature(torch.tensor([4.0]), 2.0)) ** 2).sum()
    loss.backward()
    opt.step()
assert abs(w.item() - 0.5) < 1e-3, w
'''

COMPILED_HELPER = '''
@torch.compile(dynamic=True)
def _drop_below(logits, kth):
    return logits.masked_fill(logits < kth, float("-inf"))

def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    if k <= 0 or k >= logits.shape[-1]:
        return logits.clone()
    return _drop_below(logits, torch.topk(logits, k, dim=-1).values[..., -1:])
'''

THREAD_POOL = '''
from concurrent.futures import ThreadPoolExecutor

def _nucleus_row(row: torch.Tensor, p: float) -> torch.Tensor:
    order = torch.argsort(row, descending=True)
    probs = torch.softmax(row[order].double(), dim=0)
    before = torch.cumsum(probs, 0) - probs
    drop = before >= p
    drop[0] = False
    out = row.clone()
    out[order[drop]] = float("-inf")
    return out

def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    if p >= 1.0:
        return logits.clone()
    rows = logits.reshape(-1, logits.shape[-1])
    with ThreadPoolExecutor(max_workers=4) as pool:
        done = list(pool.map(lambda r: _nucleus_row(r, p), rows))
    return torch.stack(done).reshape(logits.shape)
'''

NUMPY_FILTER = '''
import numpy as np

def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    a = logits.detach().cpu().numpy()
    if k <= 0 or k >= a.shape[-1]:
        return torch.from_numpy(a.copy())
    kth = np.partition(a, -k, axis=-1)[..., -k:].min(axis=-1, keepdims=True)
    return torch.from_numpy(np.where(a < kth, -np.inf, a).astype(a.dtype))
'''

SAMPLER_CLASS = '''
class Sampler:
    """My sampler: the knobs once, then probabilities and draws."""
    def __init__(self, temperature=1.0, top_k=0, top_p=1.0):
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p

    def probs(self, logits):
        if self.temperature == 0:
            return F.one_hot(logits.argmax(-1), logits.shape[-1]).float()
        z = apply_temperature(logits.float(), self.temperature)
        return torch.softmax(top_p_filter(top_k_filter(z, self.top_k), self.top_p), dim=-1)

    def __call__(self, logits, generator=None):
        if self.temperature == 0:
            return logits.argmax(-1)
        p = self.probs(logits)
        return torch.multinomial(p.reshape(-1, p.shape[-1]), 1,
                                 generator=generator).reshape(p.shape[:-1])

def next_token_probs(logits, temperature=1.0, top_k=0, top_p=1.0):
    return Sampler(temperature, top_k, top_p).probs(logits)

def sample_next(logits, temperature=1.0, top_k=0, top_p=1.0, generator=None):
    return Sampler(temperature, top_k, top_p)(logits, generator)
'''

# a sampling recipe unlike the solution's (temperature then top-p): the student's own min-p rule,
# written in log space, which keeps the tokens within a factor of the top token's probability
MIN_P_RECIPE = '''
MIN_P = 0.1

def my_recipe(logits, ids):
    logp = torch.log_softmax(logits, dim=-1)
    best = logp.max(dim=-1, keepdim=True).values
    return logits.masked_fill(logp < best + math.log(MIN_P), float("-inf"))
'''

PLOTS_AND_PRINTS = [
    ("00_top_p_filter", "markdown", "### My notes\nTrying the filters on a few rows, with plots."),
    ("00_top_p_filter", "code", '''
import matplotlib.pyplot as plt
x = torch.randn(200)
fig, ax = plt.subplots(1, 2, figsize=(8, 3))
ax[0].plot(torch.softmax(x, -1).sort(descending=True).values)
ax[1].hist(x.numpy(), bins=30)
plt.show()
for i in range(2000):
    print(f"line {i}: {top_k_filter(x, 5).isfinite().sum().item()} kept")
'''),
]

LRU_AND_SEED = '''
import functools
torch.manual_seed(1234)            # my own seed, for my own experiments below

@functools.lru_cache(maxsize=None)
def naive_tokens_processed(prompt_len: int, new_tokens: int) -> int:
    return sum(prompt_len + t for t in range(new_tokens))

torch.manual_seed(0)
_ = torch.randn(3)
'''

WARNINGS_RECURSION = '''
import sys
import warnings
warnings.filterwarnings("ignore")
sys.setrecursionlimit(20_000)

def naive_tokens_processed(prompt_len: int, new_tokens: int) -> int:
    def passes(t):
        return 0 if t == 0 else passes(t - 1) + prompt_len + t - 1
    return passes(new_tokens)
'''

TENSORS_NOT_LISTS = '''
@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0,
             generator=None, stop_ids=()):
    ids = torch.as_tensor(prompt_ids, dtype=torch.long).reshape(1, -1)
    stops = torch.tensor(list(stop_ids), dtype=torch.long)
    out = torch.empty(0, dtype=torch.long)
    for _ in range(max_new_tokens):
        nxt = sample_next(model(ids, last_only=True)[0, -1], temperature, top_k, top_p,
                          generator).reshape(1)
        out = torch.cat([out, nxt])
        if torch.isin(nxt, stops).any():
            break
        ids = torch.cat([ids, nxt.reshape(1, 1)], dim=1)
    return out.tolist()
'''

SUBMISSIONS = [
    Honest(LAB, "optim_sanity", "an answer cell that checks itself with torch.optim.SGD",
           {"00_apply_temperature": OPTIM_SANITY}),
    Honest(LAB, "compiled_helper", "top_k_filter's mask in a torch.compile'd helper",
           {"00_top_k_filter": COMPILED_HELPER}),
    Honest(LAB, "thread_pool", "top_p_filter maps the rows over a ThreadPoolExecutor",
           {"00_top_p_filter": THREAD_POOL}),
    Honest(LAB, "sampler_class", "next_token_probs / sample_next through a Sampler class, and a "
           "sampling recipe of the student's own (min-p) unlike the solution's",
           {"00_sample_next": SAMPLER_CLASS, "00_recipe": MIN_P_RECIPE}),
    Honest(LAB, "lru_and_seed", "functools.lru_cache and the student's own torch.manual_seed",
           {"00_naive_work": LRU_AND_SEED}),
    # two styles per notebook where they touch different cells: one graded notebook fewer each
    Honest(LAB, "numpy_filter_tensor_generate", "top_k_filter computed in NumPy; generate keeps "
           "its tokens in tensors", {"00_top_k_filter": NUMPY_FILTER, "00_generate": TENSORS_NOT_LISTS}),
    Honest(LAB, "plots_prints_warnings", "extra markdown and code cells (plots and 2,000 printed "
           "lines); warnings filtered, sys.setrecursionlimit, a recursion",
           {"00_naive_work": WARNINGS_RECURSION}, extra=PLOTS_AND_PRINTS),
]
