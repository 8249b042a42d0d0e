"""minillm.decode: the layer is written once (`Step.layer`), and every fast decoder runs it.

The other files pin each decoder to the model in detail (test_kvcache: packed; test_bandwidth and
test_quant_speed: compiled; test_graph_decode: graph). Here: one line of the shared layer is
changed, and every decoder follows the change, as the model does when its own line changes."""
import inspect
import textwrap

import pytest
import torch
import torch.nn.functional as F
from test_bandwidth import tiny

from minillm import model as model_module
from minillm.decode import CompiledDecoder, GraphDecoder, PackedDecoder, step
from minillm.kvcache import KVCache

PROMPT = torch.randint(0, 61, (1, 6), generator=torch.Generator().manual_seed(11))
DECODERS = ["packed", pytest.param("compiled", marks=pytest.mark.slow), "graph"]   # compiled:
#                                                 a fresh Inductor compile of the changed step


def next_logits(kind: str, m) -> torch.Tensor:
    """The decoder's logits [V] for the prompt followed by its own last token again."""
    last = PROMPT[0, -1:]
    with torch.no_grad():
        if kind == "graph":
            dec = GraphDecoder(m, max_len=16)
            dec.prefill(PROMPT[0].tolist())
            dec.ids.copy_(last)
            return dec.logits()[0]
        dec = PackedDecoder(m) if kind == "packed" else CompiledDecoder(m)
        cache = KVCache.for_model(m, 1, 8)
        m(PROMPT, cache=cache)
        return dec.step(last, cache)[0]


def model_with_weight(**kw):
    """The tests' tiny model with weights large enough that its MLP moves the logits."""
    m = tiny(**kw)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return m


def model_logits(m) -> torch.Tensor:
    with torch.no_grad():
        return m(torch.cat([PROMPT, PROMPT[:, -1:]], 1))[0, -1]


@pytest.mark.parametrize("kind", DECODERS)
def test_every_decoder_is_the_models_layer(kind):
    m = model_with_weight(n_kv_heads=2)
    torch.testing.assert_close(next_logits(kind, m), model_logits(m), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", DECODERS)
def test_one_changed_line_of_the_shared_layer_changes_every_decoder(kind, monkeypatch):
    m = model_with_weight(n_kv_heads=2)
    before = model_logits(m)
    # the model's MLP with GELU instead of SiLU ...
    monkeypatch.setattr(model_module.MLP, "forward",
                        lambda self, x: self.down_proj(F.gelu(self.gate_proj(x)) * self.up_proj(x)))
    after = model_logits(m)
    assert not torch.allclose(before, after, atol=1e-3), "the change must show in the logits"
    # ... and the same one line changed in the shared layer, nowhere else
    source = textwrap.dedent(inspect.getsource(step.Step.layer))
    assert source.count("F.silu(gate)") == 1
    namespace = {}
    exec(compile(source.replace("F.silu(gate)", "F.gelu(gate)"), step.__file__, "exec"),
         vars(step), namespace)
    monkeypatch.setattr(step.Step, "layer", namespace["layer"])
    torch.testing.assert_close(next_logits(kind, m), after, atol=1e-5, rtol=1e-5)


def test_the_decoders_hold_no_layer_arithmetic_of_their_own():
    """The norms, RoPE and the MLP live in step.py only; a decoder says how it multiplies and
    how it attends."""
    import minillm.decode.compiled
    import minillm.decode.graph
    import minillm.decode.packed
    for mod in (minillm.decode.packed, minillm.decode.compiled, minillm.decode.graph):
        code = inspect.getsource(mod)
        for what in ("silu", "rms_norm", "roll(", "addcmul", "rope_cos_sin"):
            assert what not in code, f"{mod.__name__} computes {what} itself: it belongs in step.py"
        assert issubclass(getattr(mod, {"minillm.decode.packed": "PackedDecoder",
                                        "minillm.decode.compiled": "CompiledDecoder",
                                        "minillm.decode.graph": "GraphDecoder"}[mod.__name__]),
                          step.Step)
