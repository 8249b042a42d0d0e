"""Knowledge distillation: train a small student on a big teacher's next-token distributions.

    python -m minillm.distill --teacher target --layers 2 --dim 192 --heads 3 --hidden 512 \\
        --steps 600 --out minillm/assets/draft-distilled

The student starts as a pruned copy of the teacher (minillm.pruning) and is trained to match the
teacher's whole distribution at every position, not just the one observed token (Hinton et al.
2015): the loss is KL(teacher || student) on logits divided by a temperature tau, times tau^2 (so
that the gradient's scale does not shrink as tau grows). A one-hot label says "the next token was
X"; the teacher's distribution also says which other tokens were nearly as likely -- more signal
per token, which is why a distilled student needs far fewer tokens than one trained from scratch.
For a speculative draft it is the right objective too: the acceptance rate is
sum_x min(p(x), q(x)) = 1 - TV(p, q), and matching the target's distribution is what raises it.

The checkpoint directory gets model.safetensors, config.json, tokenizer.json and train_log.json
(the pruning choices, the calibration set, steps, tokens, loss curve, wall time).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .pruning import calibration_batches, choose, importance, layer_drop_loss, prune


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                      temperature: float = 1.0) -> torch.Tensor:
    """Mean over positions of KL(softmax(teacher / tau) || softmax(student / tau)) * tau^2.
    Both logits [..., V]; computed in fp32."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student logits {tuple(student_logits.shape)} and teacher logits "
                         f"{tuple(teacher_logits.shape)} differ in shape")
    V = student_logits.shape[-1]
    log_s = F.log_softmax(student_logits.float().reshape(-1, V) / temperature, dim=-1)
    log_t = F.log_softmax(teacher_logits.float().reshape(-1, V) / temperature, dim=-1)
    kl = (log_t.exp() * (log_t - log_s)).sum(-1)
    return kl.mean() * temperature ** 2


def distill(student, teacher, train_ids: torch.Tensor, steps: int, batch_size: int = 8,
            seq_len: int = 256, lr: float = 1e-3, warmup: int = 20, temperature: float = 1.0,
            seed: int = 0, val_ids: torch.Tensor | None = None, eval_every: int = 100,
            autocast: bool = True, progress: bool = True) -> dict:
    """Train `student` in place on the teacher's distributions over random windows of train_ids.
    Returns a log: steps, tokens seen, the loss curve (and held-out loss every eval_every)."""
    from .train import evaluate, get_batch, lr_at
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if student.config.vocab_size != teacher.config.vocab_size:
        raise ValueError("student and teacher must share a vocabulary")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    teacher.eval()
    decay = [p for p in student.parameters() if p.dim() >= 2]
    no_decay = [p for p in student.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))
    amp = torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast)
    log = {"steps": steps, "batch_size": batch_size, "seq_len": seq_len, "lr": lr,
           "warmup": warmup, "temperature": temperature, "seed": seed, "curve": []}
    t0 = time.time()
    bar = tqdm(range(steps), desc="distill", disable=not progress)
    for step in bar:
        student.train()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, warmup)
        x, _ = get_batch(train_ids, batch_size, seq_len, gen)
        with torch.no_grad(), amp:
            t_logits = teacher(x)
        with amp:
            s_logits = student(x)
        loss = distillation_loss(s_logits, t_logits, temperature)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        bar.set_postfix(kd=f"{loss.item():.3f}")
        if val_ids is not None and ((step + 1) % eval_every == 0 or step + 1 == steps):
            val, _ = evaluate(student, val_ids, 512, max_tokens=32768)
            log["curve"].append({"step": step + 1, "kd_loss": round(loss.item(), 4),
                                 "val_loss": round(val, 4), "elapsed_s": round(time.time() - t0)})
            if progress:
                tqdm.write(f"step {step + 1}: kd {loss.item():.3f} val {val:.3f}")
    student.eval()
    log["train_tokens_seen"] = steps * batch_size * seq_len
    log["wall_s"] = round(time.time() - t0, 1)
    return log


def pruned_student(teacher, train_ids: torch.Tensor, n_layers: int, dim: int, n_heads: int,
                   hidden_dim: int, calib_samples: int = 1024, calib_len: int = 128,
                   depth: str = "drop-loss", seed: int = 0):
    """The teacher pruned to the shape by activation importance on a seeded calibration set
    (windows of the training split). Returns (student, keep, layer scores, importance)."""
    if depth not in ("drop-loss", "block-influence"):
        raise ValueError(f"depth scores are 'drop-loss' or 'block-influence', got {depth!r}")
    calib = calibration_batches(train_ids, calib_samples, calib_len, seed=seed)
    imp = importance(teacher, calib)
    scores = layer_drop_loss(teacher, calib[:8]) if depth == "drop-loss" else imp.layers
    keep = choose(imp, n_layers, n_heads, hidden_dim, dim, layer_scores=scores)
    return prune(teacher, keep), keep, scores, imp


def pruned_only(log: dict):
    """Re-derive the pruned, undistilled model a distillation log started from (the same
    teacher, shape, calibration set and seed give the same choices)."""
    import minillm

    from .data import load_tokens
    teacher = minillm.load(log["teacher"])
    shape, cal = log["pruned_from"], log["calibration"]
    train_ids = load_tokens(minillm.load_tokenizer(log["teacher"]), "train")
    return pruned_student(teacher, train_ids, len(shape["layers"]), shape["dim"],
                          shape["n_heads"], shape["hidden_dim"], cal["samples"], cal["seq_len"],
                          shape["depth_scores"], log["seed"])[0]


def build(teacher_name: str, out: Path, n_layers: int, dim: int, n_heads: int, hidden_dim: int,
          steps: int, calib_samples: int = 1024, calib_len: int = 128, depth: str = "drop-loss",
          seed: int = 0, **train_kw) -> dict:
    """Prune `teacher_name` to the given shape by activation importance, distill, save to out."""
    import minillm

    from .data import load_tokens
    from .weights import save_checkpoint
    teacher = minillm.load(teacher_name)
    tok = minillm.load_tokenizer(teacher_name)
    train_ids, val_ids = load_tokens(tok, "train"), load_tokens(tok, "val")
    t0 = time.time()
    student, keep, scores, imp = pruned_student(teacher, train_ids, n_layers, dim, n_heads,
                                                hidden_dim, calib_samples, calib_len, depth, seed)
    calib_s = time.time() - t0
    log = distill(student, teacher, train_ids, steps, seed=seed, val_ids=val_ids, **train_kw)
    log.update({"teacher": teacher_name, "params": student.num_params(),
                "pruned_from": {"layers": keep.layers, "depth_scores": depth,
                                "layer_scores": [round(float(s), 4) for s in scores],
                                "n_heads": n_heads, "hidden_dim": hidden_dim, "dim": dim},
                "calibration": {"samples": calib_samples, "seq_len": calib_len,
                                "tokens": imp.tokens, "wall_s": round(calib_s, 1)},
                "threads": torch.get_num_threads(),
                "train_tokens_available": len(train_ids)})
    save_checkpoint(student, out, tokenizer=tok, dtype=torch.bfloat16,
                    extra={"name": out.name, "trained_by": "python -m minillm.distill"})
    (out / "train_log.json").write_text(json.dumps(log, indent=2) + "\n")
    return log


def main(argv=None):
    from .train import ASSETS
    p = argparse.ArgumentParser(prog="python -m minillm.distill", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--teacher", default="target")
    p.add_argument("--layers", type=int, required=True, help="layers kept (depth)")
    p.add_argument("--dim", type=int, required=True, help="embedding channels kept")
    p.add_argument("--heads", type=int, required=True, help="attention heads kept per layer")
    p.add_argument("--hidden", type=int, required=True, help="MLP neurons kept per layer")
    p.add_argument("--depth-scores", choices=("drop-loss", "block-influence"),
                   default="drop-loss", help="how layers are ranked")
    p.add_argument("--calib-samples", type=int, default=1024)
    p.add_argument("--calib-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", type=Path, default=ASSETS / "draft-distilled")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    log = build(a.teacher, a.out, a.layers, a.dim, a.heads, a.hidden, a.steps,
                a.calib_samples, a.calib_len, a.depth_scores, a.seed, batch_size=a.batch_size,
                seq_len=a.seq_len, lr=a.lr, temperature=a.temperature)
    print(json.dumps({k: v for k, v in log.items() if k != "curve"}, indent=2))


if __name__ == "__main__":
    main()
