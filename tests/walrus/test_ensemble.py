"""Vectorized seeds (issue 55): member k of the walrus ensemble equals the solo Lightning run of seed k,
with per-seed windows and jitter draws, a shared group schedule over a periodic and a wall-bounded
group, the warmup/inverse-sqrt schedule and per-member gradient clipping; and the vectorized
learning-curve rollout equals each member's own rollout."""
from __future__ import annotations

import numpy as np
import torch

from stages.common.ensemble import solo_model
from stages.common.trainer import TrainerConfig, make_trainer
from stages.walrus.jitter import PERIODIC, PERIODIC_2D, WALL
from stages.walrus.model import Walrus, rollout_step
from stages.walrus.train import JITTER_STREAM, EnsembleWalrus, SoloWalrus, WindowStream, curve_point, ensemble_rollout

SEEDS = [3, 11, 20]
CHANNEL = ((WALL, WALL), (PERIODIC, PERIODIC))


def make(seed):
    return Walrus(d=16, depth=2, heads=1, mlp_ratio=2, max_t=2, jitter="domain", token_roll=True,
                  tokens_per_axis=4).double()


def data():
    g = torch.Generator().manual_seed(0)
    groups = {"a_32": torch.randn(3, 6, 2, 32, 32, generator=g, dtype=torch.float64).cumsum(1),
              "channel_32": torch.randn(2, 5, 2, 32, 32, generator=g, dtype=torch.float64).cumsum(1)}
    return groups, {"a_32": PERIODIC_2D, "channel_32": CHANNEL}


def trainer(steps, clip):
    return make_trainer(TrainerConfig(max_steps=steps, enable_progress_bar=False, gradient_clip_val=clip))


class Solo(SoloWalrus):
    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        self.norms = getattr(self, "norms", [])
        self.norms.append(float(torch.nn.utils.get_total_norm([p.grad for p in self.parameters()])))
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)


def test_walrus_ensemble_member_equals_solo_run():
    groups, bcs = data()
    steps, clip = 5, 0.04
    solos = []
    for s in SEEDS:
        lit = Solo(solo_model(make, s), context=2, lr=3e-3, weight_decay=1e-4, warmup=2)
        stream = WindowStream(groups, bcs, 2, 2, steps, [s], schedule_seed=5, template=make(0))
        trainer(steps, clip).fit(lit, torch.utils.data.DataLoader(stream, batch_size=None))
        solos.append(lit)
    ens = EnsembleWalrus(make, SEEDS, context=2, lr=3e-3, weight_decay=1e-4, warmup=2)
    stream = WindowStream(groups, bcs, 2, 2, steps, SEEDS, schedule_seed=5, template=make(0))
    trainer(steps, clip).fit(ens, torch.utils.data.DataLoader(stream, batch_size=None))
    losses = torch.tensor(ens.losses, dtype=torch.float64)              # (steps, S)
    keys = [b["key"] for b in WindowStream(groups, bcs, 2, 2, steps, SEEDS, 5, make(0))]
    assert set(keys) == {"a_32", "channel_32"}                         # both branches were trained
    for k, solo in enumerate(solos):
        torch.testing.assert_close(losses[:, k], torch.tensor(solo.losses, dtype=torch.float64), atol=1e-9, rtol=1e-9)
        member = ens.ensemble.member_state_dict(k)
        for name, t in solo.model.state_dict().items():
            torch.testing.assert_close(member[name], t, atol=1e-9, rtol=1e-9)
    norms = torch.tensor([s.norms for s in solos])
    assert (norms > clip).any() and (norms < clip).any()                # the per-member clip bound on some steps
    assert not torch.allclose(losses[:, 0], losses[:, 1])             # members are different runs


def test_seed_streams_are_paired_across_arms_and_independent_of_the_other_seeds():
    groups, bcs = data()
    a = list(WindowStream(groups, bcs, 2, 2, 4, [11], 5, make(0)))
    b = list(WindowStream(groups, bcs, 2, 2, 4, [3, 11], 5, make(0)))
    patch = Walrus(d=16, depth=2, heads=1, max_t=2, jitter="patch", tokens_per_axis=4)
    c = list(WindowStream(groups, bcs, 2, 2, 4, [11], 5, patch))
    for x, y, z in zip(a, b, c):
        assert torch.equal(x["window"][0], y["window"][1]) and torch.equal(x["shift"][0], y["shift"][1])
        assert torch.equal(x["window"][0], z["window"][0])               # same windows in another arm
    sh = make(0).draw(np.random.default_rng([11, JITTER_STREAM]), (32, 32), bcs[a[0]["key"]])[0]
    assert torch.equal(a[0]["shift"][0], sh)


@torch.no_grad()
def test_vectorized_rollout_equals_each_members_own_rollout():
    groups, bcs = data()
    ens = EnsembleWalrus(make, SEEDS, context=2, lr=1e-3, weight_decay=0.0, warmup=1).ensemble
    g = torch.Generator().manual_seed(9)
    with torch.no_grad():
        ens.stacked.dec2.normal_(0, 0.05, generator=g)
    init = groups["channel_32"][:, :2]
    rngs = [np.random.default_rng([s, 1]) for s in SEEDS]
    got = ensemble_rollout(ens, init, 3, CHANNEL, rngs, make(0))
    for k, s in enumerate(SEEDS):
        m, r = ens.member(k), np.random.default_rng([s, 1])
        win, outs = init.clone(), []
        for _ in range(3):
            shift, rolls = make(0).draw(r, (32, 32), CHANNEL)
            nxt = rollout_step(m, win, CHANNEL, shift, rolls)
            outs.append(nxt)
            win = torch.cat([win[:, 1:], nxt], 1)
        torch.testing.assert_close(got[k], torch.cat(outs, 1), atol=1e-10, rtol=1e-10)
    point = curve_point(ens, {"context": 2, "horizon": 3, "long_window": 2, "val": {"channel_32": groups["channel_32"]},
                              "bcs": bcs, "template": make(0), "eval_seed": 1})
    assert len(point["one_step"]) == len(SEEDS) and len(point["curve"][0]) == 3
