"""A batch-1 decode step that torch.compile turns into one C++ function: decode near the bandwidth.

At batch 1 a decode step should take bytes read / bandwidth (`minillm.bench.bandwidth`). Run op by op,
it takes longer, for two reasons the packed step (`minillm.decode.packed`) cannot remove:

* overhead: ~100 small ops per step (norms, RoPE, attention, SiLU, residual adds), each a few
  microseconds of dispatch and Python, and each reading and writing its tensors again;
* the matrix-vector product itself: the CPU BLAS streams fp32 weights at the bandwidth, but its
  bf16 product (oneDNN) reaches about half of it at one row.

`CompiledDecoder` runs the shared step (`Step`, step.py) over [out, in] weights and hands it to
`torch.compile` (Inductor), which fuses every elementwise op into its neighbours and generates the
bf16 matrix-vector product as a loop that loads each weight once, widens it to fp32 in registers
and multiply-accumulates (the fused upcast a Triton GEMV does on a GPU, lab 04). fp32 weights keep
`torch.mv`, which Inductor also turns into a loop of its own (as fast as the BLAS here).
Activations stay fp32 throughout; keys and values are stored in the cache's dtype.

Four details make the compiled step fast rather than slow:
* it runs under `torch.no_grad()`: otherwise Inductor also builds a backward graph;
* the cache is written with `narrow(...).copy_` at a position that is a symbolic integer, so one
  compiled graph serves every position (indexing with a Python int recompiles per position);
* `realize_opcount_threshold=1` makes Inductor compute each GEMV's input once: by default it
  inlines cheap producers into their consumer, and a consumer that is a matrix-vector product
  would recompute, e.g., SiLU(gate) * up once per output row.
* no size, stride and alignment asserts in the generated wrapper: it would check each of the ~60
  tensors it is given on every call, which Dynamo's guards have already checked. Without them
  the int4 step is about 7 % faster, the fp32 and int8 steps 3-5 %, bf16's no faster that one
  can measure (benchmarks/RESULTS.md, "Quantized decode on the CPU"; the probe that measured it,
  `step_wrapper.py`, is retired there with the commit that last had it).
Inductor's C++ wrapper (`cpp_wrapper`) was measured too (same probe): it makes the int4 step,
which calls torch's int4 kernel 24 times between generated kernels, about 4 % faster, and the
other formats' single-kernel steps no faster, but its C++ compile is slow: with it,
`tests/test_quant_speed.py`'s bench of a tiny model took 69 s in `make test` instead of 11 s.
So the step keeps the Python wrapper.

Quantized models (minillm.quant: `quantize_model(model, "int8")` or "int4-g64") run here too:
their merged QuantLinear matrices become `Int8Rows` (codes and one scale per row; on an AVX-512
CPU Inductor generates the product, widening each code in registers and scaling each row once;
elsewhere its loop is scalar and torch's int8 kernel runs it, see `inductor_vectorizes_int8`) or
torch's int4 CPU layout (`kernels/cpu_weight_only.py`). `minillm bench quant` times all four
formats.

Compiling takes 10-40 s on a 2-core CPU the first time (two graphs: a static one, then one
dynamic in the position); Inductor caches the result on disk, so later processes start in
seconds. The weights are `PackedDecoder`'s (layout "out_in"), so what it refuses this refuses
too; also biased projections, batches and several tokens per step, which `PackedDecoder` does.
"""
from __future__ import annotations

import types
from typing import NamedTuple

import torch

from kernels import cpu_weight_only

from ..quant import QuantLinear
from .packed import PackedDecoder
from .step import Step

INDUCTOR_OPTIONS = {"realize_opcount_threshold": 1, "size_asserts": False,
                    "alignment_asserts": False, "scalar_asserts": False}
MATRICES = ("qkv", "o", "gu", "down")


def inductor_vectorizes_int8() -> bool:
    """Whether Inductor's loop for an int8 matrix-vector product runs vectorised on this CPU.

    On the AVX-512 machine the course was developed on it did, and it keeps the activations in
    fp32. On a CPU with AVX2 only (as many laptops have) Inductor generated a scalar loop, 3-5x
    slower than torch's int8 kernel with bf16 activations, which made the int8 draft of lab 05
    cost 0.35 of a target step instead of about 0.1 and speculative decoding slower than plain
    decoding. So `step_matrix` hands int8 rows to the kernel there. Measured by
    `tests/test_quant_speed.py` (the pick must not be the slower product) and
    `benchmarks/gemv_bandwidth.py` (int8 `inductor_loop` against `torch_kernel`)."""
    return torch.backends.cpu.get_cpu_capability() == "AVX512"


class Int8Rows(NamedTuple):
    """An int8 matrix as the step reads it: codes [out, in], one scale per row, and which product
    reads them: Inductor's loop (`torch_kernel` False, fp32 scales) or torch's int8 kernel (True,
    bf16 scales, as the kernel takes them); see `inductor_vectorizes_int8`. Build it with `of`."""
    codes: torch.Tensor
    scales: torch.Tensor
    torch_kernel: bool

    @classmethod
    def of(cls, codes: torch.Tensor, scales: torch.Tensor, torch_kernel: bool) -> "Int8Rows":
        """The rows with their scales in the dtype the chosen product reads."""
        return cls(codes, scales.to(torch.bfloat16 if torch_kernel else torch.float32),
                   bool(torch_kernel))


def step_matrix(w):
    """What the compiled step keeps of one packed matrix: a float tensor as it is, an int8
    QuantLinear as `Int8Rows`, an int4 one in torch's int4 CPU layout (`W4Packed`)."""
    if isinstance(w, torch.Tensor):
        return w
    if not isinstance(w, QuantLinear) or w.input_scale is not None or w.bias is not None:
        raise ValueError(f"CompiledDecoder runs float or plain QuantLinear matrices (no AWQ "
                         f"input scale, no bias); got {w!r}")
    if w.bits == 8:
        kernel = w.qweight.is_cpu and not inductor_vectorizes_int8() and \
            "int8" not in cpu_weight_only.missing()
        return Int8Rows.of(w.qweight, w.scales, kernel)
    packed = w.w4_cpu_layout()
    if packed is None:
        raise ValueError(f"CompiledDecoder needs torch's int4 CPU kernel for {w!r}: N a multiple "
                         f"of 16, a group size in {cpu_weight_only.W4_GROUPS}")
    return packed


def gemv(x: torch.Tensor, w) -> torch.Tensor:
    """x [in] (fp32) times w [out, in] -> [out] (fp32): each weight read once.

    fp32: torch.mv, which Inductor generates into the step's own loops (as fast as the BLAS
    here). bf16 and int8: a loop Inductor generates, which loads each weight, widens it to fp32
    in registers and multiply-adds (int8: the row's scale applied once, at the end), except int8
    rows marked `torch_kernel`, which go to torch's int8 kernel (bf16 activations; see
    `inductor_vectorizes_int8`). int4: torch's int4 CPU kernel (bf16 activations), because
    Inductor's loop over groups of packed nibbles is several times slower
    (benchmarks/gemv_bandwidth.py measures them all)."""
    if isinstance(w, cpu_weight_only.W4Packed):
        return cpu_weight_only.w4_cpu_matmul(x[None], w)[0]
    if isinstance(w, Int8Rows):
        if w.torch_kernel:                          # chosen by step_matrix
            return cpu_weight_only.w8_cpu_matmul(x[None], w.codes, w.scales)[0]
        return (w.codes.float() * x).sum(-1) * w.scales
    if w.dtype == torch.float32:
        return torch.mv(w, x)
    return (w.float() * x).sum(-1)


class CompiledDecoder(Step):
    """`step(ids [1], cache) -> logits [1, V]`, the interface of `PackedDecoder.step` at batch 1,
    compiled on the first call. A snapshot of the weights: build a new one after changing them.
    `options`: Inductor's options instead of INDUCTOR_OPTIONS."""

    def __init__(self, model, options: dict | None = None):
        # the packed decoder's [out, in] weights (q/k/v and gate/up concatenated) and RoPE tables
        self.packed = p = PackedDecoder(model, layout="out_in")
        if any(w[b] is not None for w in p.layers for b in ("qkv_b", "o_b", "gu_b", "down_b")):
            raise ValueError("CompiledDecoder does not support biased projections")
        self.layers = [{k: step_matrix(v) if k in MATRICES else v for k, v in w.items()}
                       for w in p.layers]
        self.lm_head = step_matrix(p.lm_head)
        self.embed, self.norm, self.norm_eps, self.config = p.embed, p.norm, p.norm_eps, p.config
        self.cos, self.sin_signed = p.cos.float(), p.sin_signed.float()
        # Dynamo keeps its graphs on the function's code object and stops compiling a code
        # object after `recompile_limit` (8) graphs; each decoder needs two (static, then dynamic
        # position), so each decoder compiles its own copy of `_forward`'s code.
        code = CompiledDecoder._forward.__code__.replace(co_name=f"_forward_{id(self):x}")
        own = types.MethodType(types.FunctionType(code, globals(), code.co_name), self)
        self._compiled = torch.compile(own, options=INDUCTOR_OPTIONS if options is None
                                       else options)

    def mm(self, a, w, b):
        """a [1, in] times w -> [1, out] (fp32; no bias, see __init__)."""
        return gemv(a.view(-1), w).view(1, -1)

    def _forward(self, ids, pos, cos, sin, ks, vs):
        """The whole step on plain tensors: ids [1], pos the position (symbolic once compiled),
        cos and sin [H] that position's rotary tables, ks/vs the cache's [1, K, S, H] tensors."""
        c = self.config
        N, K, H = c.n_heads, c.n_kv_heads, c.head_dim

        def attend(i, q, k, v):                   # q [1, N, H], k and v [1, K, H]
            ks[i][0].narrow(1, pos, 1).copy_(k.transpose(0, 1))              # cache [K, S, H]
            vs[i][0].narrow(1, pos, 1).copy_(v.transpose(0, 1))
            keys, values = ks[i][0, :, :pos + 1].float(), vs[i][0, :, :pos + 1].float()
            q = q.reshape(K, N // K, H)                                      # GQA: K groups
            scores = q @ keys.transpose(1, 2) * H ** -0.5                   # [K, N/K, p+1]
            return (torch.softmax(scores, -1) @ values).reshape(1, N * H)

        return self.run(self.embed[ids].float(), cos, sin, attend)

    @torch.no_grad()
    def step(self, ids: torch.Tensor, cache) -> torch.Tensor:
        if ids.shape != (1,):
            raise ValueError(f"CompiledDecoder decodes one token of one sequence: ids must have "
                             f"shape (1,), got {tuple(ids.shape)}")
        p = cache.seq_len
        if p + 1 > cache.max_len:
            raise ValueError(f"KV cache is full: it holds {p} of {cache.max_len} positions")
        logits = self._compiled(ids, p, self.cos[p], self.sin_signed[p], cache.k, cache.v)
        cache.advance(cache.positions[p:p + 1])
        return logits
