"""Train the shipped checkpoints: a byte-level BPE tokenizer, a target model and a draft model.

    python -m minillm.train tokenizer                       # -> minillm/assets/tokenizer.json
    python -m minillm.train model --preset target --steps 3000
    python -m minillm.train model --preset draft  --steps 3000

Runs on CPU (bf16 autocast where the CPU supports it) or GPU, seeded, with a tqdm bar. The
checkpoint directory gets model.safetensors, config.json, tokenizer.json and train_log.json
(steps, tokens seen, loss curve, wall time), which the model card reads.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from . import diffusion
from .config import SHIPPED_SHAPES
from .data import load_text, load_tokens
from .model import Transformer
from .tokenizer import Tokenizer
from .weights import save_checkpoint

ASSETS = Path(__file__).resolve().parent / "assets"
TOKENIZER_FILE = ASSETS / "tokenizer.json"

PRESETS = SHIPPED_SHAPES


def get_batch(data: torch.Tensor, batch_size: int, seq_len: int, gen: torch.Generator):
    starts = torch.randint(0, len(data) - seq_len - 1, (batch_size,), generator=gen)
    x = torch.stack([data[s:s + seq_len] for s in starts])
    y = torch.stack([data[s + 1:s + seq_len + 1] for s in starts])
    return x, y


@torch.no_grad()
def evaluate(model, data: torch.Tensor, seq_len: int, batch_size: int = 8,
             max_tokens: int | None = None, device="cpu") -> tuple[float, int]:
    """Mean next-token cross-entropy over consecutive non-overlapping windows of ``data``."""
    model.eval()
    n_windows = (len(data) - 1) // seq_len
    if max_tokens is not None:
        n_windows = min(n_windows, max(1, max_tokens // seq_len))
    total, count = 0.0, 0
    for i in range(0, n_windows, batch_size):
        idx = range(i, min(i + batch_size, n_windows))
        x = torch.stack([data[j * seq_len:(j + 1) * seq_len] for j in idx]).to(device)
        y = torch.stack([data[j * seq_len + 1:(j + 1) * seq_len + 1] for j in idx]).to(device)
        logits = model(x).float()
        total += F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").item()
        count += y.numel()
    return total / count, count


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train_model(preset: str, steps: int, out: Path, batch_size: int = 8, seq_len: int = 512,
                lr: float = 2e-3, warmup: int = 100, seed: int = 0, device: str = "cpu",
                eval_every: int = 250, autocast: bool = True, compile: bool = False,
                init_from: Path | None = None, save_every_eval: bool = False) -> dict:
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    tok = Tokenizer.from_file(TOKENIZER_FILE)
    config = PRESETS[preset]
    extra_ids = 0 if config.causal else 1          # a diffusion model's [MASK] token
    if config.vocab_size != tok.vocab_size + extra_ids:
        raise ValueError(f"preset vocab {config.vocab_size} != tokenizer vocab {tok.vocab_size}"
                         f" + {extra_ids}")
    train_ids, val_ids = load_tokens(tok, "train"), load_tokens(tok, "val")
    model = Transformer(config).to(device)
    previous = None
    if init_from is not None:        # continue training a checkpoint (fresh optimizer + schedule)
        from .weights import load_checkpoint
        model = load_checkpoint(init_from).to(device)
        if model.config != config:
            raise ValueError(f"{init_from} is not a {preset!r} checkpoint")
        log_file = Path(init_from) / "train_log.json"
        previous = json.loads(log_file.read_text()) if log_file.is_file() else None
    fwd = torch.compile(model) if compile else model
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))
    amp = torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16,
                         enabled=autocast)
    log = {"preset": preset, "compile": compile, "threads": torch.get_num_threads(), "params": model.num_params(), "steps": steps,
           "batch_size": batch_size, "seq_len": seq_len, "lr": lr, "seed": seed,
           "device": device, "train_tokens_available": len(train_ids), "curve": []}
    t0 = time.time()
    tokens_seen = steps * batch_size * seq_len       # less where a diffusion batch is cut short
    bar = tqdm(range(steps), desc=f"train {preset}")
    for step in bar:
        model.train()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, warmup)
        x, y = get_batch(train_ids, batch_size, seq_len, gen)
        if config.causal:
            with amp:
                logits = fwd(x.to(device))
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.to(device).flatten())
        else:                   # masked diffusion: predict the masked tokens, weighted by 1/t
            if torch.rand((), generator=gen) < diffusion.SHORT_SHARE:   # also learn short texts
                x = x[:, :int(torch.randint(32, seq_len, (), generator=gen))]
            tokens_seen += x.numel() - batch_size * seq_len
            t = diffusion.mask_rates(batch_size, gen)
            xt, masked = diffusion.corrupt(x, t, config.vocab_size - 1, gen)
            with amp:
                logits = fwd(xt.to(device))
            loss = diffusion.diffusion_loss(logits, x.to(device), masked.to(device), t)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            if config.causal:
                val, _ = evaluate(model, val_ids, seq_len, max_tokens=32768, device=device)
            else:
                val, _ = diffusion.nll_bound(model, val_ids, seq_len, rates_per_window=2,
                                             max_tokens=16384)
            log["curve"].append({"step": step + 1, "train_loss": round(loss.item(), 4),
                                 "val_loss": round(val, 4), "elapsed_s": round(time.time() - t0)})
            tqdm.write(f"step {step + 1}: train {loss.item():.3f} val {val:.3f}")
            if save_every_eval:      # a usable checkpoint survives an interrupted run
                _save(model, out, tok, preset, dict(log, steps_done=step + 1))
    log["train_tokens_seen"] = tokens_seen
    log["wall_s"] = round(time.time() - t0, 1)
    log["warmup"] = warmup
    if previous is not None:         # one log for the whole history: totals + each phase
        phases = previous.pop("phases", None) or [previous]
        log["phases"] = phases + [{k: v for k, v in log.items() if k != "phases"}]
        offset = sum(ph["steps"] for ph in phases)
        for point in log["curve"]:
            point["step"] += offset
        log["curve"] = sum((ph["curve"] for ph in phases), []) + log["curve"]
        log["steps"] = offset + steps
        log["train_tokens_seen"] = sum(ph["train_tokens_seen"] for ph in log["phases"])
        log["wall_s"] = round(sum(ph["wall_s"] for ph in log["phases"]), 1)
    _save(model, out, tok, preset, log)
    return log


def _save(model, out: Path, tok, preset: str, log: dict) -> None:
    was = next(model.parameters()).dtype, next(model.parameters()).device
    model = model.float().cpu().eval()
    save_checkpoint(model, out, tokenizer=tok, dtype=torch.bfloat16,
                    extra={"name": preset, "trained_by": "python -m minillm.train"})
    (out / "train_log.json").write_text(json.dumps(log, indent=2) + "\n")
    model.to(dtype=was[0], device=was[1])


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m minillm.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    t = sub.add_parser("tokenizer", help="train the byte-level BPE tokenizer on the train split")
    t.add_argument("--vocab-size", type=int, default=4096)
    t.add_argument("--out", type=Path, default=TOKENIZER_FILE)
    m = sub.add_parser("model", help="train a model preset")
    m.add_argument("--preset", choices=sorted(PRESETS), required=True)
    m.add_argument("--steps", type=int, default=2000)
    m.add_argument("--batch-size", type=int, default=8)
    m.add_argument("--seq-len", type=int, default=512)
    m.add_argument("--lr", type=float, default=2e-3)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    m.add_argument("--no-autocast", action="store_true", help="train in fp32")
    m.add_argument("--compile", action="store_true", help="torch.compile the training forward")
    m.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    m.add_argument("--warmup", type=int, default=100, help="linear warm-up steps")
    m.add_argument("--init-from", type=Path, default=None,
                   help="continue from this checkpoint's weights (its train_log.json is extended)")
    m.add_argument("--out", type=Path, default=None, help="default: minillm/assets/<preset>")
    m.add_argument("--save-every-eval", action="store_true",
                   help="also write the checkpoint at every evaluation (its log says how far)")
    a = p.parse_args(argv)
    if getattr(a, "threads", None):
        torch.set_num_threads(a.threads)
    if a.what == "tokenizer":
        tok = Tokenizer.train([load_text("train")], vocab_size=a.vocab_size)
        a.out.parent.mkdir(parents=True, exist_ok=True)
        tok.save(a.out)
        print(f"tokenizer: {tok.vocab_size} tokens -> {a.out}")
    else:
        log = train_model(a.preset, a.steps, a.out or ASSETS / a.preset, a.batch_size, a.seq_len,
                          a.lr, warmup=a.warmup, seed=a.seed, device=a.device,
                          autocast=not a.no_autocast, compile=a.compile, init_from=a.init_from,
                          save_every_eval=a.save_every_eval)
        print(json.dumps({k: v for k, v in log.items() if k != "curve"}, indent=2))


if __name__ == "__main__":
    main()
