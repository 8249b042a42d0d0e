"""Lab 11: probes that run the student's `shard_block` in 2 (or 4) gloo ranks forked from their
kernel, and what the tests hold the result against.

`block_run` builds a random decoder block from a seed in every rank, hands it to the student's
`shard_block(block, rank, world)`, runs the returned module on the same input and returns, per
rank: the output, the collectives that ran during that forward (seen from PyTorch's dispatcher,
so every way of calling gloo counts: `dist.all_reduce`, `all_reduce_sum`, the process group's
own methods) and the bytes of the tensors the module keeps alive (storages, so a view of the
whole weight counts as the whole weight). The tester builds the same block from the same seed
and computes the full block's output itself (`full_block_output`)."""
from __future__ import annotations

import copy

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from autograder.probes import fresh_model, probe
from minillm.config import ModelConfig
from minillm.generate import generate_naive
from minillm.model import Block, rope_cos_sin
from minillm.sampling import SamplingParams

TIMEOUT_S = 30            # a rank that hangs (mismatched collectives) fails within this

# (dim, n_heads, n_kv_heads, hidden_dim, head_dim): multi-head, GQA (K < N), MQA with K < W
BLOCK_CASES = {
    "mha": dict(dim=64, n_heads=4, n_kv_heads=4, hidden_dim=96, head_dim=16),
    "gqa": dict(dim=96, n_heads=6, n_kv_heads=2, hidden_dim=160, head_dim=16),
    "mqa": dict(dim=64, n_heads=4, n_kv_heads=1, hidden_dim=128, head_dim=16),
}


def block_config(shape: dict) -> ModelConfig:
    return ModelConfig(vocab_size=64, n_layers=1, max_seq_len=64, **shape)


def random_block(shape: dict, seed: int) -> Block:
    """A decoder block with weights from N(0, 0.1) and norm weights from U(0.5, 1.5), the same
    wherever it is built; the global RNG is left as it was."""
    g = torch.Generator().manual_seed(seed)
    block = Block(block_config(shape), 0).eval()
    with torch.no_grad():
        for name, p in block.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return block


def block_input(shape: dict, seed: int, batch: int, T: int):
    """(x [batch, T, dim], cos, sin) for a causal prefill from position 0."""
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch, T, shape["dim"], generator=g)
    cos, sin = rope_cos_sin(torch.arange(T), shape["head_dim"], 10000.0, x.dtype)
    return x, cos, sin


@torch.no_grad()
def full_block_output(shape: dict, seed: int, batch: int, T: int) -> torch.Tensor:
    """What every rank's part must return: the whole block on the same input (the tester's)."""
    x, cos, sin = block_input(shape, seed, batch, T)
    return random_block(shape, seed)(x, cos, sin, None)


def projection_bytes(shape: dict) -> int:
    """fp32 bytes of the block's seven projections (the norms are tiny and stay whole)."""
    D, N, K, F, H = (shape[k] for k in ("dim", "n_heads", "n_kv_heads", "hidden_dim", "head_dim"))
    return 4 * (2 * D * N * H + 2 * D * K * H + 3 * D * F)


def rank_bytes_allowed(shape: dict, world: int) -> int:
    """What one rank of `world` needs: 1/W of q, o and the MLP, its KV heads (a whole one each
    when W > K: copies), both norms, plus 10 % for whatever else a design keeps."""
    D, N, K, F, H = (shape[k] for k in ("dim", "n_heads", "n_kv_heads", "hidden_dim", "head_dim"))
    kv_heads = K // world if K % world == 0 else 1
    need = 4 * (2 * D * N * H // world + 2 * D * kv_heads * H + 3 * D * F // world + 2 * D)
    return int(need * 1.10)


class CollectiveLog(TorchDispatchMode):
    """Names of the c10d collectives dispatched while active (`c10d.allreduce_`, ...)."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if name.startswith("c10d."):
            self.names.append(name.split(".")[1].rstrip("_"))
        return func(*args, **(kwargs or {}))


def kept_bytes(module) -> int:
    """Bytes of every tensor storage `module` keeps alive: parameters, buffers and tensors (or
    NumPy arrays) held in attributes of it and of every module it reaches (submodules, or modules
    and tensors kept in lists, tuples and dicts), each storage counted once and whole."""
    storages: dict[int, int] = {}
    seen: set[int] = set()
    todo = [module]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            s = obj.untyped_storage()
            storages[s.data_ptr()] = s.nbytes()
        elif isinstance(obj, np.ndarray):           # a NumPy copy (or view) of a weight counts too
            base = obj
            while isinstance(base.base, np.ndarray):
                base = base.base
            storages[base.__array_interface__["data"][0]] = max(
                base.nbytes, storages.get(base.__array_interface__["data"][0], 0))
        elif isinstance(obj, (list, tuple, set, frozenset)):
            todo.extend(obj)
        elif isinstance(obj, dict):
            todo.extend(obj.values())
        elif isinstance(obj, torch.nn.Module):
            todo.extend(vars(obj).values())      # _parameters, _buffers, _modules, attributes
    return sum(storages.values())


def _block_rank(rank, world, shard_block, shape, seed, batch, T):
    block = random_block(shape, seed)
    part = shard_block(block, rank, world)
    if not isinstance(part, torch.nn.Module):
        raise TypeError(f"shard_block returned {type(part).__name__}: return a torch.nn.Module "
                        f"whose forward takes (x, cos, sin, positions, cache=None)")
    del block
    x, cos, sin = block_input(shape, seed, batch, T)
    with torch.no_grad(), CollectiveLog() as log:
        out = part(x, cos, sin, None)
    return {"output": out.detach(), "collectives": log.names, "bytes": kept_bytes(part)}


@probe
def block_run(shard_block, case: str, seed: int, world: int = 2, batch: int = 2,
              T: int = 5) -> list:
    """Each rank's {"output", "collectives", "bytes"} for the student's shard_block on
    random_block(BLOCK_CASES[case], seed), in `world` forked gloo ranks."""
    from minillm.parallel import run_ranks
    return run_ranks(_block_rank, world, shard_block, BLOCK_CASES[case], seed, batch, T,
                     start="fork", timeout_s=TIMEOUT_S)


def _refusal_rank(rank, world, shard_block, shape, seed):
    try:
        shard_block(random_block(shape, seed), rank, world)
    except ValueError as e:
        said = f"ValueError: {e}"
    except Exception as e:          # noqa: BLE001 -- reported as what it was
        said = f"{type(e).__name__}: {e}"
    else:
        said = None
    return said


@probe
def refusal(shard_block, shape: dict, world: int, seed: int = 0) -> list:
    """What shard_block raised in each of `world` ranks (in a real group of that size) for a
    block that cannot be split over them: "ValueError: ..." strings, or None where it did not."""
    from minillm.parallel import run_ranks
    return run_ranks(_refusal_rank, world, shard_block, shape, seed, start="fork",
                     timeout_s=TIMEOUT_S)


def check_block(shard_block, case: str, seed: int, world: int = 2, *, what=("output",
                "collectives", "bytes"), ranks=None) -> list:
    """AssertionError unless every rank's output is the full block's (fp32), the forward ran
    exactly two all-reduces and nothing else, and each rank keeps at most its share of the
    weights; returns the ranks' results (`ranks`: block_run's, already run)."""
    shape = BLOCK_CASES[case]
    if ranks is None:
        ranks = block_run(shard_block, case, seed, world)
    want = full_block_output(shape, seed, 2, 5)
    where = f"{case} block (N = {shape['n_heads']} heads, K = {shape['n_kv_heads']} KV heads), " \
            f"W = {world}, seed {seed}"
    for r, got in enumerate(ranks):
        if "output" in what:
            out = got["output"]
            assert tuple(out.shape) == tuple(want.shape), \
                f"{where}: rank {r} returned shape {tuple(out.shape)}, the block's is " \
                f"{tuple(want.shape)}"
            err = (out - want).abs().max().item()
            assert torch.allclose(out, want, atol=1e-4, rtol=1e-4), \
                f"{where}: rank {r}'s output differs from the whole block's by up to {err:.3g}"
        if "collectives" in what:
            seen = got["collectives"]
            assert seen == ["allreduce", "allreduce"], \
                f"{where}: rank {r}'s forward ran the collectives {seen or 'none'}; a split " \
                f"block needs exactly two all-reduces (after attention, after the MLP)"
        if "bytes" in what:
            allowed, full = rank_bytes_allowed(shape, world), projection_bytes(shape)
            assert got["bytes"] <= allowed, \
                f"{where}: rank {r}'s module keeps {got['bytes']:,} bytes of tensors; its share " \
                f"is at most {allowed:,} (the whole block's projections are {full:,}). Keep only " \
                f"your slices, and .clone() them: a view keeps the whole weight alive"
    return ranks


def _tokens_rank(rank, world, shard_block, model, prompt, n_new):
    return greedy(split_model(model, rank, world, shard_block), prompt, n_new)


def greedy(model, prompt: list, n_new: int) -> list:
    """n_new greedy tokens after `prompt` (minillm's naive loop: a full forward pass a token)."""
    return generate_naive(model, list(prompt), SamplingParams(temperature=0, max_new_tokens=n_new))[0]


def split_model(model, rank: int, world: int, shard_block):
    """A copy of `model` whose every layer is `shard_block(layer, rank, world)` (the lab's
    measurements run on the student's split)."""
    local = copy.deepcopy(model)
    for i, layer in enumerate(local.layers):
        local.layers[i] = shard_block(layer, rank, world)
    return local


@probe
def split_tokens(shard_block, prompt: list, n_new: int, world: int = 2) -> list:
    """Every rank's greedy tokens from a fresh shipped `target` whose every layer is split by the
    student's shard_block over `world` forked ranks."""
    from minillm.parallel import run_ranks
    return run_ranks(_tokens_rank, world, shard_block, fresh_model("target"), list(prompt),
                     n_new, start="fork", timeout_s=TIMEOUT_S)
