"""The program model's SFT schedule (warmup-stable-decay: the lr each step uses) and the early-stopping callback's
candidate points (a start step, a fixed interval, the last step always)."""
from __future__ import annotations


import pytest
import torch

from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig
from stages.common.trainer import TrainerConfig, make_trainer
from stages.futurecad.lit import SFTModule, wsd_multiplier
from stages.futurecad.model import BOS, EOS, RowLoader
from stages.futurecad import train
from stages.futurecad.train import EvalEvery, ProgramConfig

TCFG = TrainerConfig(enable_progress_bar=False)


def test_wsd_multiplier_by_hand():
    # S = 3 stable steps, D = 4 decay steps: 1, 1, 1, then (3 + 4 − k) / 5 for k = 3..6
    assert [wsd_multiplier(k, 3, 4) for k in range(8)] == pytest.approx([1, 1, 1, 0.8, 0.6, 0.4, 0.2, 0.0])
    assert [wsd_multiplier(k, 5, 0) for k in range(7)] == [1.0] * 7        # no decay: constant
    assert wsd_multiplier(0, 0, 2) == pytest.approx(2 / 3)


def _rows(n=12, seed=3):
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, 10, (n, 3), generator=g)
    prompt[:, -1] = BOS
    script = torch.randint(3, 10, (n, 5), generator=g)
    script[:, -1] = EOS
    return torch.cat([prompt, script], 1)


def _lm(seed=0):
    torch.manual_seed(seed)
    return TinyTransformer(TinyTransformerConfig(vocab_size=10, d_model=16, n_layers=1, n_heads=2, max_seq_len=8))


class _Batches:
    """A fixed list of batches as a loader (Lightning reads a bare list as several loaders)."""

    def __init__(self, batches):
        self.batches = batches

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        return iter(self.batches)


def _fit(module, loader, steps, callbacks=()):
    loader = _Batches(loader) if isinstance(loader, list) else loader
    make_trainer(TCFG, None, callbacks=list(callbacks), max_steps=steps).fit(module, loader)
    return module


def test_sft_steps_use_the_wsd_lr():
    m = _fit(SFTModule(_lm(), 3, 0.0037, stable=4, decay=3), RowLoader(_rows(), 4, 7, seed=1), 7)
    want = [0.0037 * wsd_multiplier(k, 4, 3) for k in range(7)]
    assert [h["lr"] for h in m.history] == pytest.approx(want, rel=1e-9)
    assert [h["step"] for h in m.history] == list(range(7))
    const = _fit(SFTModule(_lm(), 3, 0.0037), RowLoader(_rows(), 4, 3, seed=1), 3)
    assert [h["lr"] for h in const.history] == pytest.approx([0.0037] * 3)


def test_decay_must_leave_a_stable_part():
    with pytest.raises(ValueError, match="sft_decay_steps: 200 must be below sft_steps 200"):
        ProgramConfig(sft_steps=200, sft_decay_steps=200)
    assert ProgramConfig(sft_steps=200, sft_decay_steps=40).sft_decay_steps == 40
    # the SFT-only arm runs sft_steps + the RL steps' compute: 200 + ceil(36·4·8·(2 + 3·2) / (3·32)) = 200 + 96
    arm = dict(sft_steps=200, rl_steps=36, prompts_per_step=4, sft_batch=32)
    with pytest.raises(ValueError, match="sft_only_decay_steps: 296 must be below the SFT-only arm's 296 steps"):
        ProgramConfig(**arm, sft_only_decay_steps=296)
    assert ProgramConfig(**arm, sft_only_decay_steps=250).sft_only_decay_steps == 250


def test_stable_without_decay_is_constant():
    m = _fit(SFTModule(_lm(), 3, 0.0041, stable=2), RowLoader(_rows(), 4, 5, seed=1), 5)
    assert [h["lr"] for h in m.history] == pytest.approx([0.0041] * 5)


def test_eval_every_candidates_start_interval_and_last_step():
    seen = []

    def fn(module):
        seen.append(int(module.trainer.global_step))
        return {"val_reward": [0.1, 0.5, 0.3, 0.5, 0.2][len(seen) - 1]}

    cb = EvalEvery(fn, 4, keep=lambda m: m.model, start=3)
    _fit(SFTModule(_lm(), 3, 0.01), RowLoader(_rows(), 4, 13, seed=1), 13, [cb])
    assert [r["step"] for r in cb.rows] == [3, 7, 11, 13]             # start, +4, +4, then the last step
    assert cb.best == 0.5 and cb.best_step == 7                       # ties keep the earlier
    cb0 = EvalEvery(lambda m: {"val_reward": 0.0}, 5)
    _fit(SFTModule(_lm(), 3, 0.01), RowLoader(_rows(), 4, 10, seed=1), 10, [cb0])
    assert [r["step"] for r in cb0.rows] == [0, 5, 10]                 # the last step not evaluated twice


def test_snapshots_scored_after_training_equal_scoring_during_it():
    """SnapshotEvery copies the model at EvalEvery's points and scores the copies later: the same rows, the same
    best step, and the kept state is the model's state at that step (a score that reads the weights)."""
    def score(model):
        return {"val_reward": round(float(model.embed.weight.sum()), 5), "w": model.embed.weight[0, 0].item()}

    live = EvalEvery(lambda m: score(m.model), 4, keep=lambda m: m.model, start=3)
    snaps = train.SnapshotEvery(lambda m: m.model, 4, start=3)
    _fit(SFTModule(_lm(), 3, 0.01), RowLoader(_rows(), 4, 13, seed=1), 13, [live])
    _fit(SFTModule(_lm(), 3, 0.01), RowLoader(_rows(), 4, 13, seed=1), 13, [snaps])
    assert [s for s, _ in snaps.snapshots] == [3, 7, 11, 13] and not snaps.rows     # nothing scored yet
    snaps.score(score, _lm())
    assert snaps.rows == live.rows and snaps.best_step == live.best_step and snaps.best == live.best
    assert all(torch.equal(snaps.best_state[k], live.best_state[k]) for k in live.best_state)
    probe = _lm()
    probe.load_state_dict(snaps.best_state)
    assert score(probe)["val_reward"] == snaps.best
