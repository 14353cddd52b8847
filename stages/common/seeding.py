"""One call seeds every random source a stage may touch (python, numpy, torch, Lightning)."""
from __future__ import annotations

import os
import random

import numpy as np


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    os.environ["PYTHONHASHSEED"] = str(seed)
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return
    torch.manual_seed(seed)


def rng(seed: int) -> np.random.Generator:
    """A numpy Generator for stage code that wants explicit, local randomness."""
    return np.random.default_rng(seed)
