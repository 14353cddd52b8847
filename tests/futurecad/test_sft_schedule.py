"""The program model's SFT schedule (warmup-stable-decay) and the SFT-only arm's branch from the stable state:
the lr each step uses, and that resuming the saved model + AdamW state continues the run exactly."""
from __future__ import annotations

import copy

import pytest
import torch

from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig
from stages.common.trainer import TrainerConfig, make_trainer
from stages.futurecad.lit import SFTModule, wsd_multiplier
from stages.futurecad.model import BOS, EOS, RowLoader
from stages.futurecad.train import ProgramConfig, Snapshot

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


def test_branch_from_the_stable_state_continues_the_run_exactly():
    """S steps + Snapshot, then a new module resuming (model, AdamW state) for k more steps on the next batches
    ends with the same weights as one constant-lr run of S + k steps (AdamW's step counts and moments travel);
    a fresh AdamW from the same weights does not."""
    rows, S, k = _rows(), 3, 4
    batches = list(RowLoader(rows, 4, S + k, seed=5))
    one = _fit(SFTModule(_lm(), 3, 0.01, stable=S + k, decay=0), batches, S + k)

    snap = Snapshot(S)
    first = _fit(SFTModule(_lm(), 3, 0.01, stable=S + 2, decay=2), batches[:S], S, [snap])
    assert first.history[-1]["lr"] == pytest.approx(0.01)                  # the stable part only ran
    lm2 = _lm(seed=99)
    lm2.load_state_dict(snap.model)
    resumed = _fit(SFTModule(lm2, 3, 0.01, stable=k, decay=0, opt_state=snap.optimizer), batches[S:], k)
    for a, b in zip(one.model.state_dict().values(), resumed.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)

    lm3 = _lm(seed=99)
    lm3.load_state_dict(snap.model)
    fresh = _fit(SFTModule(lm3, 3, 0.01, stable=k, decay=0), batches[S:], k)
    diff = max(float((a - b).abs().max()) for a, b in zip(one.model.state_dict().values(),
                                                            fresh.model.state_dict().values()))
    assert diff > 1e-4


def test_snapshot_at_zero_is_the_initial_state():
    lm = _lm()
    init = copy.deepcopy(lm.state_dict())
    snap = Snapshot(0)
    _fit(SFTModule(lm, 3, 0.01), RowLoader(_rows(), 4, 2, seed=1), 2, [snap])
    for name, t in init.items():
        assert torch.equal(snap.model[name], t)
    assert snap.optimizer["state"] == {}


def test_decay_must_leave_a_stable_part():
    with pytest.raises(ValueError, match="sft_decay_steps: 200 must be below sft_steps 200"):
        ProgramConfig(sft_steps=200, sft_decay_steps=200)
    assert ProgramConfig(sft_steps=200, sft_decay_steps=40).sft_decay_steps == 40


def test_resumed_state_takes_this_modules_lr_not_the_saved_one():
    """A state saved mid-decay of a run at lr 0.02 (its param group holds lr 0.02·m and initial_lr 0.02), resumed at
    lr 0.007: every step uses 0.007 × this module's own schedule."""
    snap = Snapshot(3)
    _fit(SFTModule(_lm(), 3, 0.02, stable=1, decay=4), RowLoader(_rows(), 4, 4, seed=2), 4, [snap])
    saved = snap.optimizer["param_groups"][0]
    assert saved["initial_lr"] == pytest.approx(0.02) and saved["lr"] != pytest.approx(0.02)
    const = _fit(SFTModule(_lm(), 3, 0.007, opt_state=copy.deepcopy(snap.optimizer)), RowLoader(_rows(), 4, 3, seed=4), 3)
    assert [h["lr"] for h in const.history] == pytest.approx([0.007] * 3)
    sched = _fit(SFTModule(_lm(), 3, 0.007, stable=1, decay=2, opt_state=copy.deepcopy(snap.optimizer)),
                 RowLoader(_rows(), 4, 3, seed=4), 3)
    assert [h["lr"] for h in sched.history] == pytest.approx([0.007, 0.007 * 2 / 3, 0.007 / 3])


def test_stable_without_decay_is_constant():
    m = _fit(SFTModule(_lm(), 3, 0.0041, stable=2), RowLoader(_rows(), 4, 5, seed=1), 5)
    assert [h["lr"] for h in m.history] == pytest.approx([0.0041] * 5)
