"""The naive generation loop on a tiny random model."""
import pytest
import torch

from minillm.config import ModelConfig
from minillm.generate import generate_naive, stream_naive
from minillm.model import Transformer
from minillm.sampling import SamplingParams


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Transformer(ModelConfig(vocab_size=61, dim=32, n_layers=2, n_heads=4, hidden_dim=48,
                                   max_seq_len=40)).eval()


def manual_greedy(model, prompt, n):
    ids = list(prompt)
    for _ in range(n):
        with torch.no_grad():
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt):]


def test_greedy_matches_a_hand_written_loop(model):
    out = generate_naive(model, [1, 2, 3], SamplingParams(temperature=0, max_new_tokens=10))
    assert out == [manual_greedy(model, [1, 2, 3], 10)]


def test_batch_rows_equal_single_runs(model):
    prompts = torch.tensor([[1, 2, 3], [4, 5, 6]])
    p = SamplingParams(temperature=0, max_new_tokens=6)
    out = generate_naive(model, prompts, p)
    assert out == [generate_naive(model, [1, 2, 3], p)[0], generate_naive(model, [4, 5, 6], p)[0]]


def test_seed_reproducible_and_different_seeds_differ(model):
    def p(s):
        return SamplingParams(temperature=1.5, max_new_tokens=20, seed=s)
    assert generate_naive(model, [7], p(1)) == generate_naive(model, [7], p(1))
    assert generate_naive(model, [7], p(1)) != generate_naive(model, [7], p(2))


def test_stop_token_ends_generation_and_is_returned(model):
    greedy = manual_greedy(model, [1, 2, 3], 10)
    stop = greedy[4]
    first = greedy.index(stop)
    out = generate_naive(model, [1, 2, 3], SamplingParams(temperature=0, max_new_tokens=10,
                                                         stop_ids=(stop,)))[0]
    assert out == greedy[:first + 1]


def test_max_new_tokens_zero_and_exact_count(model):
    assert generate_naive(model, [1], SamplingParams(max_new_tokens=0)) == [[]]
    assert len(generate_naive(model, [1], SamplingParams(max_new_tokens=9, seed=0))[0]) == 9


def test_each_step_reruns_the_whole_prefix(model):
    """The naive loop's cost: step t pushes prompt_len + t tokens through the model."""
    seen = []
    hook = model.embed_tokens.register_forward_hook(lambda m, i, o: seen.append(i[0].shape[1]))
    try:
        list(stream_naive(model, [1, 2, 3, 4], SamplingParams(temperature=0, max_new_tokens=5)))
    finally:
        hook.remove()
    assert seen == [4, 5, 6, 7, 8]


@pytest.mark.parametrize("prompt, n, match", [
    (list(range(41)), 1, "context"),
    (list(range(30)), 20, "max_new_tokens"),
    ([], 1, "non-empty"),
    ([61], 1, r"\[0, 61\)"),
    ([-1], 1, r"\[0, 61\)"),
])
def test_bad_input_raises(model, prompt, n, match):
    with pytest.raises(ValueError, match=match):
        generate_naive(model, prompt, SamplingParams(max_new_tokens=n))
