"""GraphDecoder (minillm.decode.graph): the fixed-buffer step that a CUDA graph records. On the
CPU it runs eagerly, which is where its tokens are checked against the naive loop; the graph
itself, and its speed, are measured by benchmarks/gpu_decode.py on a GPU."""
import pytest
import torch
from test_bandwidth import tiny  # the same small random model as the CPU's compiled step's tests

import minillm
from minillm.bench.quant import first_divergence
from minillm.decode import GraphDecoder
from minillm.generate import generate_naive
from minillm.quant import quantize_model
from minillm.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0, max_new_tokens=20)


@pytest.fixture(scope="module")
def target():
    return minillm.load("target", dtype=torch.bfloat16)


def assert_greedy_matches(model, prompt, got):
    """`got` is the naive loop's greedy continuation, or equal to it up to a token where the
    naive loop's two best logits were a bf16 rounding apart (a tie that the order of additions
    in a one-token step can break the other way; seen: 5.4375 against 5.40625, one bf16 step)."""
    want = generate_naive(model, prompt, SamplingParams(temperature=0, max_new_tokens=len(got)))[0]
    if got == want:
        return
    i = first_divergence(got, want)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + want[:i]]))[0, -1].float()
    best, chosen = logits[want[i]], logits[got[i]]
    assert model.embed_tokens.weight.dtype != torch.float32, f"fp32 tokens differ at {i}"
    assert best - chosen <= 0.02 * best.abs(), (
        f"token {i}: {got[i]} (logit {chosen:.4f}) where the naive loop chose {want[i]} "
        f"({best:.4f}): not a rounding tie")


@pytest.mark.parametrize("scheme", [None, "int8", "int4-g64"])
def test_the_shipped_models_greedy_tokens_equal_the_naive_loops(target, scheme):
    model = target if scheme is None else quantize_model(target, scheme)
    prompt = list(range(5, 29))
    dec = GraphDecoder(model, max_len=44)
    assert dec.generate(prompt, 20) == generate_naive(model, prompt, GREEDY)[0]
    assert_greedy_matches(model, prompt[:7], dec.generate(prompt[:7], 20))


def test_fp32_tokens_and_logits_are_the_models():
    model = minillm.load("target")
    for prompt in (list(range(5, 29)), list(range(5, 12))):
        dec = GraphDecoder(model, max_len=44)
        assert dec.generate(prompt, 20) == generate_naive(model, prompt, GREEDY)[0]
        dec.prefill(prompt)                  # ids: the first new token, at position len(prompt)
        with torch.no_grad():
            want = model(torch.tensor([prompt + [dec.ids.item()]]))[:, -1]
        torch.testing.assert_close(dec.logits(), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kw", [dict(n_kv_heads=2), dict(n_kv_heads=1)])
def test_grouped_heads_and_a_full_cache(kw):
    m = tiny(**kw)
    prompt = torch.randint(0, 61, (1, 6), generator=torch.Generator().manual_seed(6))
    dec = GraphDecoder(m, max_len=16)
    want = generate_naive(m, prompt, SamplingParams(temperature=0, max_new_tokens=11))[0]
    assert dec.generate(prompt, 11) == want                # the last slot of the cache used
    assert dec.pos.item() == 16
    with pytest.raises(ValueError, match="n must be in 1..11"):
        dec.generate(prompt, 12)


@pytest.mark.parametrize("kw", [dict(generated_matvec=False), dict(generated_matvec=True),
                                pytest.param(dict(triton_gemv=True), marks=pytest.mark.slow)])
def test_the_compiled_step_gives_the_same_tokens(kw):
    m = tiny(n_kv_heads=2)
    prompt = [3, 14, 15, 9, 2, 6]
    dec = GraphDecoder(m, max_len=24, compile=True, **kw)
    assert dec.generate(prompt, 12) == \
        generate_naive(m, prompt, SamplingParams(temperature=0, max_new_tokens=12))[0]


@pytest.mark.slow    # the Triton GEMV in the interpreter over a whole model: make test
def test_the_triton_gemv_step_gives_the_models_tokens_and_logits():
    """Products on kernels/gemv.py's GEMV (the Triton interpreter here, hence a tiny model)
    instead of torch's."""
    model = tiny(n_kv_heads=2)
    prompt = [3, 14, 15, 9, 2, 6]
    dec = GraphDecoder(model, max_len=16, triton_gemv=True)
    assert dec.generate(prompt, 8) == \
        generate_naive(model, prompt, SamplingParams(temperature=0, max_new_tokens=8))[0]
    dec.prefill(prompt)
    with torch.no_grad():
        want = model(torch.tensor([prompt + [dec.ids.item()]]))[:, -1]
    torch.testing.assert_close(dec.logits(), want, atol=1e-4, rtol=1e-4)


def test_the_compiled_step_writes_the_cache_in_place():
    """Each layer's cache is an input of its own, so the compiled step writes one position into
    it rather than copying the whole cache (a write into a view of one [layers, ...] tensor was
    compiled into a copy of all of it)."""
    m = tiny(n_kv_heads=2)
    dec = GraphDecoder(m, max_len=24, compile=True)
    ks = [k.data_ptr() for k in dec.k]
    dec.generate([3, 14, 15], 4)
    assert [k.data_ptr() for k in dec.k] == ks and len(set(ks)) == m.config.n_layers
    assert all(k[:, :6].abs().sum() > 0 and k[:, 6:].abs().sum() == 0 for k in dec.k)


def test_bad_input_is_refused_by_name():
    m = tiny()
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA graph needs the model on a GPU"):
            GraphDecoder(m, graph=True)
    with pytest.raises(ValueError, match="max_len"):
        GraphDecoder(m, max_len=65)
    with pytest.raises(ValueError, match="needs compile=True"):
        GraphDecoder(m, generated_matvec=True)
    with pytest.raises(ValueError, match="one of triton_gemv and generated_matvec"):
        GraphDecoder(m, compile=True, generated_matvec=True, triton_gemv=True)
    dec = GraphDecoder(m, max_len=8)
    with pytest.raises(ValueError, match="one sequence"):
        dec.prefill([[1, 2], [3, 4]])
    with pytest.raises(ValueError, match="9 tokens"):
        dec.prefill(list(range(9)))
    with pytest.raises(ValueError, match="token ids"):
        dec.prefill([1, 61])
    with pytest.raises(ValueError, match="non-empty"):
        dec.prefill([])
    m.layers[0].self_attn.window = 4
    with pytest.raises(ValueError, match="layer 0"):
        GraphDecoder(m)


def test_the_gpu_benchmark_says_it_measured_nothing_without_a_gpu(capsys):
    from benchmarks import gpu_decode
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: benchmarks/gpu_decode.py measures for real")
    assert gpu_decode.main([]) == 0
    assert "nothing was measured" in capsys.readouterr().out
