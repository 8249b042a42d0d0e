"""Each lab's grading module, labNN.py: its probes (autograder/probes.py) and, for a timed claim,
SPEED_CHECK (speedcheck.py). Here: what several labs share."""
from __future__ import annotations

import importlib
import numbers
import pkgutil
import re
from types import ModuleType

import torch

from autograder.checks import WorkCounter
from autograder.probes import fresh_model, probe, shipped_model  # noqa: F401 (the labs' import)

_LAB_MODULE = re.compile(r"^lab\d\d$")


def random_model(seed: int, config: dict, std: float | None = None, norms=None):
    """A model seeded alike wherever built; std: weights from N(0, std), norms' from U(*norms)."""
    from minillm.config import ModelConfig
    from minillm.model import Transformer
    torch.manual_seed(seed)
    model = Transformer(ModelConfig(**config)).eval()
    if std is not None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if norms and name.endswith("norm.weight"):
                    p.uniform_(*norms)
                else:
                    p.normal_(0.0, std)
    return model


def counted(model, fn, *args, **kwargs) -> tuple:
    """(`fn(model, *args, **kwargs)`, {"calls": forward calls, "through": token positions})."""
    with WorkCounter(model) as work:
        out = fn(model, *args, **kwargs)
    return out, {"calls": work.calls, "through": work.tokens}


def context_ids(vocab_size: int, n: int, seed: int) -> torch.Tensor:
    return torch.randint(1, vocab_size, (1, n), generator=torch.Generator().manual_seed(seed))


def whole_number(value, lo: int, hi: int, call: str, hi_name: str = "") -> int:
    """A design rule's answer as an int: any whole number (Python, NumPy or a one-element tensor;
    never a bool or a string) in lo..hi, else AssertionError naming `call` and the range (with
    the bound's name, `hi_name`, where it is an argument)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or \
            not float(value).is_integer() or not lo <= value <= hi:
        named = f"{lo}..{hi_name} = " if hi_name else ""
        raise AssertionError(f"{call} returned {value!r}: an int in {named}{lo}..{hi}")
    return int(value)


def model_of(random=None):
    """A fresh copy of the shipped model, or random_model(*random) for random=(seed, config)."""
    return fresh_model() if random is None else random_model(*random)


@probe
def counted_generate(generate, prompt_ids, max_new_tokens, *args, random_model=None,
                     **kwargs) -> dict:
    """`generate(model_of(random_model), prompt_ids, ...)`: {"tokens", "calls", "through",
    "prompt": prompt_ids as the call left them}."""
    tokens, work = counted(model_of(random_model), generate, prompt_ids, max_new_tokens, *args,
                           **kwargs)
    return {"tokens": tokens, **work, "prompt": prompt_ids}


@probe
def args_after(fn, *args, **kwargs) -> list:
    """The positional arguments as `fn(*args, **kwargs)` leaves them: what a call does to its
    arguments stays in the kernel, so a test of "the input was not modified" asks this."""
    fn(*args, **kwargs)
    return list(args)


@probe
def with_config(fn, config: dict, *args):
    from minillm.config import ModelConfig
    return fn(ModelConfig.from_dict(config), *args)


def lab_modules() -> list[ModuleType]:
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if _LAB_MODULE.match(m.name))
    return [importlib.import_module(f"{__name__}.{n}") for n in names]


def speed_checks() -> dict:
    """{"labNN": SpeedCheck} for every lab module that defines SPEED_CHECK, in lab order."""
    return {m.__name__.rsplit(".", 1)[-1]: m.SPEED_CHECK for m in lab_modules()
            if hasattr(m, "SPEED_CHECK")}
