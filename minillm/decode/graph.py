"""Batch-1 decode on a GPU as one CUDA graph: the whole loop stays on the device.

A decode step of a Llama-shaped model launches about 28 kernels per layer in eager PyTorch (two
norms of four kernels each, four matrix products, RoPE, two cache writes, attention, SiLU,
residual adds; 630 per step of a 22-layer model, profiled). Launched from Python,
each costs about ten microseconds of CPU time (Python and dispatch: the shipped model's eager
step, 6 layers of those kernels, took 2.2 ms on an H200), and the GPU finishes small kernels faster than the
CPU can issue them: the step is bound by *launches*, not by memory, and the GPU idles between
kernels. A CUDA graph records the launches once; a replay issues all of them with one call.

For a graph every tensor must keep its address and shape from one step to the next, so
`GraphDecoder` keeps everything in fixed buffers:

* the token and its position are one-element tensors (`ids`, `pos`) that the step reads;
* keys and values go into a static cache, one [K, max_len, H] tensor per layer, with
  `index_copy_` at `pos`;
* attention runs over all `max_len` slots with a mask `slot <= pos` (the same shape each step;
  the masked slots cost their reads, which `step_bytes` does not count: the fraction of the
  bandwidth limit it reports is, if anything, low);
* the step ends by choosing the next token on the device (greedy: argmax), writing it to
  `ids` and to the output buffer `tokens`, and adding 1 to `pos`. So one replay = one token, and
  a loop of replays never waits for the CPU: Python only says "again".

The step is the shared one (`Step`, step.py) over `PackedDecoder`'s weights (layout "out_in":
q/k/v and gate/up merged, so 4 products per layer), float (cuBLAS) or `QuantLinear` (the Triton fused dequant-matmul kernels, lab 04). The
same code runs eagerly (`graph=False`; on a CPU always), which is how the tests check it against
the naive loop and how `benchmarks/gpu_decode.py` measures what the graph removes. With
`compile=True` the step goes through `torch.compile` first, which fuses the norms, RoPE, SiLU and
residual adds into a few generated kernels (fewer kernels per layer), and the graph records
those.

`triton_gemv=True` computes the float products with the Triton batch-1 kernel of
kernels/gemv.py instead of cuBLAS (one operator, `gemv_float`, so compile and graph keep it one
kernel); it streams the decoders' matrices 1.01-1.33x faster than cuBLAS on an H200.

Measured on an H200 (benchmarks/RESULTS.md, "Decode on the bandwidth scale on a GPU"): the graph
makes the shipped model's step 6.5x faster; a 7B-parameter model's step reaches 0.59 of the
device copy's rate with the graph, 0.73 compiled, 0.79 compiled with `triton_gemv`.
`generated_matvec` (Inductor's own products) was slower there than cuBLAS; it is kept so that
the comparison can be rerun.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.gemv import gemv_float

from ..generate import as_prompt_batch, check_vocab
from .compiled import gemv
from .packed import PackedDecoder
from .step import Step


class GraphDecoder(Step):
    """Greedy batch-1 decode with fixed buffers: `generate(prompt, n)` -> n new token ids.
    graph=None: a CUDA graph where the model is on a GPU, eager steps elsewhere."""

    def __init__(self, model, max_len: int | None = None, graph: bool | None = None,
                 compile: bool = False, generated_matvec: bool = False,
                 triton_gemv: bool = False):
        self.packed = p = PackedDecoder(model, layout="out_in")
        self.config = c = p.config
        self.layers, self.embed, self.lm_head = p.layers, p.embed, p.lm_head
        self.norm, self.norm_eps = p.norm, p.norm_eps
        dev, dt = p.embed.device, p.embed.dtype
        self.max_len = max_len or c.max_seq_len
        if not 0 < self.max_len <= c.max_seq_len:
            raise ValueError(f"max_len must be in 1..{c.max_seq_len} (the model's RoPE table), "
                             f"got {max_len}")
        self.use_graph = dev.type == "cuda" if graph is None else graph
        if self.use_graph and dev.type != "cuda":
            raise ValueError(f"a CUDA graph needs the model on a GPU, not {dev}")
        # one tensor per layer, not one [layers, ...] tensor: torch.compile turns a write into a
        # view of a bigger input into a copy of all of it (seen on the H200: the whole cache
        # copied every step); a write into an input of its own is done in place
        shape = (c.n_kv_heads, self.max_len, c.head_dim)
        self.k = [torch.zeros(shape, device=dev, dtype=dt) for _ in range(c.n_layers)]
        self.v = [torch.zeros(shape, device=dev, dtype=dt) for _ in range(c.n_layers)]
        self.ids = torch.zeros(1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)
        self.tokens = torch.zeros(self.max_len + 1, dtype=torch.long, device=dev)
        self.slots = torch.arange(self.max_len, device=dev)
        self._graph = None
        self.n_prompt = None                 # set by prefill
        if generated_matvec and not compile:
            raise ValueError("generated_matvec=True needs compile=True (Inductor writes it)")
        self.generated_matvec = generated_matvec
        if triton_gemv and generated_matvec:
            raise ValueError("choose one of triton_gemv and generated_matvec")
        self.triton_gemv = triton_gemv
        if compile:       # Inductor fuses the small ops between the products: fewer kernels
            self._advance = torch.compile(self._advance)

    def mm(self, x, w, b):
        """x [1, in] @ w.T (+ b). With generated_matvec a float w goes through the CPU compiled
        step's product (`minillm.decode.compiled.gemv`), which Inductor writes as a kernel of its
        own (each weight read once, fp32 accumulation) instead of a cuBLAS call; with
        triton_gemv through the Triton GEMV of kernels/gemv.py (`gemv_float`)."""
        if self.generated_matvec and isinstance(w, torch.Tensor):
            y = gemv(x[0].float(), w).to(x.dtype)[None]
            return y if b is None else y + b
        if self.triton_gemv and isinstance(w, torch.Tensor):
            y = gemv_float(x, w)
            return y if b is None else y + b
        return self.packed.mm(x, w, b)

    def _logits(self) -> torch.Tensor:
        """One step for the token in `ids` at position `pos` -> logits [1, V]; writes its keys
        and values into the cache. Only fixed-shape tensor ops: capturable in a CUDA graph."""
        c, p, pos = self.config, self.packed, self.pos
        N, K, H = c.n_heads, c.n_kv_heads, c.head_dim
        cos, sin = p.cos.index_select(0, pos), p.sin_signed.index_select(0, pos)   # [1, H]
        visible = (self.slots <= pos).view(1, -1)                            # [1, max_len]

        def attend(i, q, k, v):                   # q [1, N, H], k and v [1, K, H]
            self.k[i].index_copy_(1, pos, k.transpose(0, 1))                # [K, max_len, H]
            self.v[i].index_copy_(1, pos, v.transpose(0, 1))
            # GQA without copies: the N/K query heads of a group are the group's "queries"
            att = F.scaled_dot_product_attention(q.reshape(1, K, N // K, H), self.k[i][None],
                                                 self.v[i][None], attn_mask=visible)
            return att.reshape(1, N * H)

        return self.run(self.embed[self.ids], cos, sin, attend)                 # [1, V]

    def _advance(self) -> None:
        """A step, then greedy choice and bookkeeping on the device: the next token goes to
        `ids` and to `tokens[pos + 1]`, and `pos` moves on."""
        nxt = self._logits().argmax(-1)                                      # [1]
        self.tokens.index_copy_(0, self.pos + 1, nxt)
        self.ids.copy_(nxt)
        self.pos.add_(1)

    def _capture(self) -> None:
        """Record `_advance` in a CUDA graph, after warm-up steps on a side stream (Triton's
        first calls compile, cuBLAS picks its kernels; none of that may happen while
        recording). The warm-up writes keys and values at the current position, which the next
        real step overwrites."""
        saved = self.pos.clone(), self.ids.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self._advance()
                self.pos.copy_(saved[0])
        torch.cuda.current_stream().wait_stream(side)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph):
            self._advance()
        self.pos.copy_(saved[0]), self.ids.copy_(saved[1])

    @torch.no_grad()
    def logits(self) -> torch.Tensor:
        """The logits [1, V] of a step for the token in `ids` at `pos`, without choosing or
        advancing (its keys and values are written, as the next step would write them)."""
        return self._logits()

    @torch.no_grad()
    def step(self) -> None:
        """One token: a graph replay (recorded on the first call) or the eager step."""
        if not self.use_graph:
            return self.eager_step()
        if self._graph is None:
            self._capture()
        self._graph.replay()

    @torch.no_grad()
    def eager_step(self) -> None:
        """One token, each kernel launched from Python: what the graph saves is the difference
        (benchmarks/gpu_decode.py times both on one decoder)."""
        self._advance()

    @torch.no_grad()
    def prefill(self, prompt) -> None:
        """Run the prompt's tokens one step each (batch 1): the cache then holds the prompt and
        `ids` the first new token. One step per token keeps one graph for everything; a real
        server prefills in one batched pass (lab 06)."""
        ids = as_prompt_batch(prompt, self.embed.device)
        if ids.shape[0] != 1:
            raise ValueError(f"GraphDecoder decodes one sequence; got {ids.shape[0]} prompts")
        if not 0 < ids.shape[1] <= self.max_len:
            raise ValueError(f"the prompt has {ids.shape[1]} tokens; GraphDecoder holds 1.."
                             f"{self.max_len}")
        check_vocab(self, ids)
        for t, tok in enumerate(ids[0]):
            self.pos.fill_(t)
            self.ids.copy_(tok.view(1))
            self.step()
        self.n_prompt = ids.shape[1]

    def decode(self, n: int) -> None:
        """n - 1 more steps after `prefill` (whose last step already chose the first token):
        `tokens` then holds n new tokens. No synchronisation with the CPU in between."""
        if self.n_prompt is None:
            raise ValueError("decode needs a prompt first: call prefill(prompt)")
        have = self.max_len - self.n_prompt + 1
        if not 0 < n <= have:
            raise ValueError(f"n must be in 1..{have} (the cache holds {self.max_len} "
                             f"positions and the prompt {self.n_prompt}), got {n}")
        for _ in range(n - 1):
            self.step()

    def generate(self, prompt, n: int) -> list[int]:
        """The prompt's n greedy continuation tokens."""
        self.prefill(prompt)
        self.decode(n)
        return self.tokens[self.n_prompt:self.n_prompt + n].tolist()
