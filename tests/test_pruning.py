"""Structured pruning and distillation (minillm.pruning, minillm.distill) and the shipped
`draft-distilled` checkpoint."""
import json

import pytest
import torch
import torch.nn.functional as F

import minillm
from minillm.config import ModelConfig
from minillm.distill import distill, distillation_loss
from minillm.model import Transformer
from minillm.pruning import (
    Keep,
    calibration_batches,
    choose,
    importance,
    layer_drop_loss,
    lm_loss,
    prune,
    skip_layers,
    top,
)
from minillm.weights import save_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(seed=0, **kw):
    torch.manual_seed(seed)
    cfg = dict(vocab_size=50, dim=32, n_layers=3, n_heads=4, hidden_dim=48, max_seq_len=32)
    cfg.update(kw)
    m = Transformer(ModelConfig(**cfg)).eval()
    with torch.no_grad():          # break the init's symmetry so that every part matters
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return m


def ids(n=2, T=12, seed=1, V=50):
    return torch.randint(0, V, (n, T), generator=torch.Generator().manual_seed(seed))


def keep_all(m, **over):
    c = m.config
    k = dict(layers=list(range(c.n_layers)), heads=[list(range(c.n_heads))] * c.n_layers,
             neurons=[list(range(c.hidden_dim))] * c.n_layers, channels=list(range(c.dim)))
    k.update(over)
    return Keep(**k)


@torch.no_grad()
def test_keeping_everything_is_the_same_model():
    m, x = tiny(), ids()
    torch.testing.assert_close(prune(m, keep_all(m))(x), m(x))


@torch.no_grad()
def test_pruned_heads_and_neurons_equal_zeroed_ones():
    """Dropping heads / neurons is exactly zeroing what they write (the o_proj / down_proj
    columns): the remaining arithmetic is unchanged."""
    m, x = tiny(), ids()
    heads, neurons = [[0, 2], [1, 3], [0, 1]], [list(range(0, 48, 2))] * 3
    small = prune(m, keep_all(m, heads=heads, neurons=neurons))
    assert small.config.n_heads == 2 and small.config.hidden_dim == 24
    assert small.config.head_dim == m.config.head_dim and small.num_params() < m.num_params()
    H = m.config.head_dim
    for i, layer in enumerate(m.layers):
        for h in set(range(4)) - set(heads[i]):
            layer.self_attn.o_proj.weight[:, h * H:(h + 1) * H] = 0
        drop = sorted(set(range(48)) - set(neurons[i]))
        layer.mlp.down_proj.weight[:, drop] = 0
    torch.testing.assert_close(small(x), m(x), atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_pruned_layers_equal_skipped_ones_and_channels_slice_every_matrix():
    m, x = tiny(), ids()
    small = prune(m, keep_all(m, layers=[0, 2], heads=[list(range(4))] * 2,
                              neurons=[list(range(48))] * 2))
    torch.testing.assert_close(small(x), skip_layers(m, {1})(x))
    ch = [1, 3, 4, 8, 9, 10, 20, 31]
    narrow = prune(m, keep_all(m, channels=ch))
    assert narrow.config.dim == 8 and narrow.config.head_dim == m.config.head_dim
    torch.testing.assert_close(narrow.embed_tokens.weight, m.embed_tokens.weight[:, ch])
    torch.testing.assert_close(narrow.layers[1].self_attn.q_proj.weight,
                               m.layers[1].self_attn.q_proj.weight[:, ch])
    torch.testing.assert_close(narrow.layers[1].mlp.down_proj.weight,
                               m.layers[1].mlp.down_proj.weight[ch])
    assert narrow.lm_head.weight is narrow.embed_tokens.weight           # still tied
    assert narrow(x).shape == (2, 12, 50)


def test_bad_keeps_are_refused():
    m = tiny()
    with pytest.raises(ValueError, match="same number"):
        prune(m, keep_all(m, heads=[[0, 1], [0], [1, 2]]))
    with pytest.raises(ValueError, match="distinct"):
        prune(m, keep_all(m, channels=[0, 0, 1]))
    with pytest.raises(ValueError, match="distinct"):
        prune(m, keep_all(m, layers=[0, 1, 7]))
    with pytest.raises(ValueError, match="GQA"):
        prune(tiny(n_kv_heads=2), keep_all(tiny(n_kv_heads=2)))
    with pytest.raises(ValueError, match="cannot keep"):
        top(torch.ones(3), 4)


@torch.no_grad()
def test_importance_scores_are_the_activation_sizes():
    m, x = tiny(), ids(n=3)
    imp = importance(m, [x[:2], x[2:]])
    c = m.config
    assert imp.tokens == 36 and imp.heads.shape == (3, 4) and imp.neurons.shape == (3, 48)
    assert imp.channels.shape == (32,) and imp.layers.shape == (3,)
    # recompute layer 1's head and neuron scores by hand
    h = m.embed_tokens(x)
    from minillm.model import rope_cos_sin
    cos, sin = rope_cos_sin(torch.arange(12), c.head_dim, c.rope_theta, h.dtype)
    h = m.layers[0](h, cos, sin, None)
    a = m.layers[1].self_attn
    seen = {}
    a.o_proj.register_forward_pre_hook(lambda mod, args: seen.setdefault("o", args[0]))
    mid = h + a(m.layers[1].input_layernorm(h), cos, sin, None)
    g = m.layers[1].mlp
    z = m.layers[1].post_attention_layernorm(mid)
    act = F.silu(g.gate_proj(z)) * g.up_proj(z)
    heads = seen["o"].reshape(-1, 4, c.head_dim).norm(dim=-1).mean(0)
    torch.testing.assert_close(imp.heads[1], heads, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(imp.neurons[1], act.abs().reshape(-1, 48).mean(0),
                               atol=1e-5, rtol=1e-4)
    out = mid + g(z)
    bi = (1 - F.cosine_similarity(h, out, dim=-1)).mean()
    torch.testing.assert_close(imp.layers[1], bi, atol=1e-5, rtol=1e-4)
    assert (imp.channels > 0).all() and (imp.layers >= 0).all() and (imp.layers <= 2).all()


def test_choose_keeps_the_top_scores_in_order_and_drop_loss_scores_layers():
    m = tiny()
    batches = calibration_batches(torch.randint(0, 50, (400,)), 8, 16, batch_size=4)
    assert len(batches) == 2 and batches[0].shape == (4, 16)
    imp = importance(m, batches)
    keep = choose(imp, n_layers=2, n_heads=2, hidden_dim=16, dim=24)
    assert keep.layers == top(imp.layers, 2) and keep.layers == sorted(keep.layers)
    assert keep.heads[0] == top(imp.heads[keep.layers[0]], 2)
    assert len(keep.neurons[1]) == 16 and len(keep.channels) == 24
    drops = layer_drop_loss(m, batches)
    base = lm_loss(m, batches)
    assert drops[1] == pytest.approx(lm_loss(skip_layers(m, {1}), batches) - base)
    assert top(torch.tensor([3.0, 1.0, 3.0, 2.0]), 2) == [0, 2]          # ties: lower index
    with pytest.raises(ValueError, match="1-D"):
        calibration_batches(torch.zeros(2, 5, dtype=torch.long), 1, 2)


def test_distillation_loss_is_the_tempered_kl():
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(2, 5, 11, generator=g), torch.randn(2, 5, 11, generator=g)
    assert distillation_loss(t, t).item() == pytest.approx(0.0, abs=1e-6)
    for tau in (1.0, 2.0, 0.5):
        want = F.kl_div(F.log_softmax(s / tau, -1).reshape(-1, 11),
                        F.log_softmax(t / tau, -1).reshape(-1, 11), log_target=True,
                        reduction="batchmean") * tau ** 2
        assert distillation_loss(s, t, tau).item() == pytest.approx(want.item(), rel=1e-5)
    s.requires_grad_(True)
    distillation_loss(s, t).backward()
    assert s.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="temperature"):
        distillation_loss(s, t, 0)
    with pytest.raises(ValueError, match="shape"):
        distillation_loss(s, t[:, :3])


def test_distill_moves_the_student_towards_the_teacher():
    teacher, data = tiny(seed=3), torch.randint(0, 50, (2000,), generator=torch.Generator().manual_seed(2))
    imp = importance(teacher, calibration_batches(data, 8, 16))
    student = prune(teacher, choose(imp, n_layers=2, n_heads=2, hidden_dim=24, dim=16))
    x = ids(n=4, T=16, seed=9)
    with torch.no_grad():
        before = distillation_loss(student(x), teacher(x)).item()
    log = distill(student, teacher, data, steps=30, batch_size=4, seq_len=16, lr=3e-3, warmup=3,
                  progress=False, autocast=False)
    with torch.no_grad():
        after = distillation_loss(student(x), teacher(x)).item()
    assert after < 0.8 * before and log["train_tokens_seen"] == 30 * 4 * 16
    assert not student.training


@torch.no_grad()
def test_a_pruned_checkpoint_reloads_to_the_same_logits(tmp_path):
    m, x = tiny(), ids()
    small = prune(m, keep_all(m, layers=[0, 2], heads=[[1, 2]] * 2, neurons=[list(range(20))] * 2,
                              channels=list(range(16))))
    save_checkpoint(small, tmp_path / "small")
    again = minillm.load(tmp_path / "small")
    assert again.config == small.config
    torch.testing.assert_close(again(x), small(x))


def test_the_shipped_distilled_draft():
    target, draft, dd = (minillm.load(n) for n in ("target", "draft", "draft-distilled"))
    log = json.loads((minillm.resolve("draft-distilled") / "train_log.json").read_text())
    assert dd.config.vocab_size == target.config.vocab_size
    assert dd.config.n_layers == len(log["pruned_from"]["layers"]) < target.config.n_layers
    assert dd.num_params() == log["params"] < target.num_params() / 6
    assert log["calibration"]["samples"] == 1024 and log["teacher"] == "target"
    # it learned from the target on far fewer tokens than the scratch draft saw
    scratch = json.loads((minillm.resolve("draft") / "train_log.json").read_text())
    assert log["train_tokens_seen"] < scratch["train_tokens_seen"] / 2
    assert log["curve"][-1]["val_loss"] < 4.3
