"""Vectorized seed ensembles (stages/common/ensemble.py): member k of one ensemble run equals an
independent solo Lightning run of seed k (its own init, its own shuffled DataLoader, its own AdamW,
Lightning's own gradient clipping), per-seed data order, member export, bad inputs.

Tolerances: float64 runs agree to 1e-10 (only summation order differs between bmm and mm);
float32 runs to atol 1e-5 / rtol 1e-5 after the steps below (vmap's bmm rounds differently from mm;
measured: float64 ≤ 5e-16, float32 ≤ 5e-7).
"""
from __future__ import annotations

from functools import partial

import itertools

import lightning as L
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from stages.common.ensemble import (EnsembleModule, SeedBatchSampler, SeedEnsemble, clip_grad_norm_per_member,
                                    seed_loader, solo_model)
from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig
from stages.common.trainer import TrainerConfig, make_trainer

SEEDS = [3, 11, 29]
LR, WD = 0.03, 0.1  # non-unit lr, real weight decay


def make_mlp(seed: int, dtype=torch.float64) -> nn.Module:
    return nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.LayerNorm(16), nn.Linear(16, 3)).to(dtype)


TT_CFG = TinyTransformerConfig(vocab_size=23, d_model=16, n_layers=2, n_heads=2, max_seq_len=8)


def make_tt(seed: int) -> nn.Module:
    return TinyTransformer(TT_CFG)


def mlp_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def lm_loss(model, batch):
    (tokens,) = batch
    logits = model(tokens[:, :-1])  # (B, T-1, V)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def mlp_data(n=20):
    g = torch.Generator().manual_seed(1234)
    return (torch.randn(n, 5, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,), generator=g))


def lm_data(n=12):
    g = torch.Generator().manual_seed(99)
    return (torch.randint(0, TT_CFG.vocab_size, (n, 8), generator=g),)


class Solo(L.LightningModule):
    """The reference: an ordinary single-seed Lightning run, written without the ensemble code."""

    def __init__(self, model, loss_fn):
        super().__init__()
        self.model, self.loss_fn, self.losses, self.norms = model, loss_fn, [], []

    def training_step(self, batch, batch_idx):
        loss = self.loss_fn(self.model, batch)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=LR, weight_decay=WD)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        self.norms.append(float(torch.nn.utils.get_total_norm([p.grad for p in self.parameters()])))
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)  # Lightning's own clip


def trainer(steps, clip=None):
    return make_trainer(TrainerConfig(max_steps=steps, enable_progress_bar=False, gradient_clip_val=clip))


def solo_run(make, seed, data, loss_fn, batch_size, steps, clip=None):
    torch.manual_seed(seed)
    solo = Solo(make(seed), loss_fn)
    loader = DataLoader(TensorDataset(*data), batch_size=batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(seed))
    trainer(steps, clip).fit(solo, loader)
    return solo.model, torch.tensor(solo.losses, dtype=torch.float64), solo.norms


class Arm(EnsembleModule):
    def __init__(self, make, seeds, loss_fn):
        super().__init__(make, seeds, optimizer=partial(torch.optim.AdamW, lr=LR, weight_decay=WD))
        self.loss_fn, self.history = loss_fn, []

    def member_loss(self, model, batch):
        return self.loss_fn(model, batch)

    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        self.history.append(self.last_losses.double().clone())
        return out


def ensemble_run(make, seeds, data, loss_fn, batch_size, steps, clip=None):
    arm = Arm(make, seeds, loss_fn)
    trainer(steps, clip).fit(arm, seed_loader(data, batch_size, seeds))
    return arm, torch.stack(arm.history, dim=1)  # (S, steps)


def assert_members_equal_solo(arm, losses, solos, atol, rtol):
    for k, (model, solo_losses, _) in enumerate(solos):
        torch.testing.assert_close(losses[k], solo_losses, atol=atol, rtol=rtol)
        member = arm.ensemble.member_state_dict(k)
        for name, t in model.state_dict().items():
            torch.testing.assert_close(member[name], t, atol=atol, rtol=rtol, msg=lambda m: f"seed {SEEDS[k]} {name}: {m}")


def test_mlp_ensemble_equals_solo_with_per_seed_clipping():
    data, steps, clip = mlp_data(), 7, 1.5  # 20 items, B=6: 4 batches/epoch (last one short), 2 epochs
    solos = [solo_run(make_mlp, s, data, mlp_loss, 6, steps, clip) for s in SEEDS]
    arm, losses = ensemble_run(make_mlp, SEEDS, data, mlp_loss, 6, steps, clip)
    assert_members_equal_solo(arm, losses, solos, atol=1e-10, rtol=1e-10)
    # the clip bound on some steps but not all, and differently per seed: a global norm would differ
    norms = torch.tensor([n for _, _, n in solos])  # (S, steps)
    assert (norms > clip).any() and (norms < clip).any()
    for k in range(1, len(SEEDS)):
        assert not torch.allclose(losses[0], losses[k])  # members are really different runs

    class GlobalClip(Arm):  # Lightning's default: one norm over all stacked gradients couples the seeds
        configure_gradient_clipping = L.LightningModule.configure_gradient_clipping

    coupled = GlobalClip(make_mlp, SEEDS, mlp_loss)
    trainer(steps, clip).fit(coupled, seed_loader(data, 6, SEEDS))
    assert not torch.allclose(torch.stack(coupled.history, dim=1), losses, atol=1e-3)


def test_mlp_ensemble_equals_solo_float32():
    data = tuple(t.float() if t.is_floating_point() else t for t in mlp_data())
    make = partial(make_mlp, dtype=torch.float32)
    solos = [solo_run(make, s, data, mlp_loss, 6, 6) for s in SEEDS]
    arm, losses = ensemble_run(make, SEEDS, data, mlp_loss, 6, 6)
    assert_members_equal_solo(arm, losses, solos, atol=1e-5, rtol=1e-5)


def test_tiny_transformer_ensemble_equals_solo():
    data, steps = lm_data(), 5  # 12 sequences, B=4: 3 batches/epoch, crosses an epoch boundary
    solos = [solo_run(make_tt, s, data, lm_loss, 4, steps) for s in SEEDS]
    arm, losses = ensemble_run(make_tt, SEEDS, data, lm_loss, 4, steps)
    assert_members_equal_solo(arm, losses, solos, atol=1e-5, rtol=1e-5)
    assert (losses[:, -1] < losses[:, 0]).all()


def test_forward_shared_and_stacked_inputs_match_members():
    ens = SeedEnsemble(make_tt, SEEDS)
    x = torch.randint(0, TT_CFG.vocab_size, (len(SEEDS), 3, 7))
    out = ens(x)  # (S, B, T, V)
    shared = ens(x[0], shared=True)
    hidden = ens.vmap(lambda m, t: m.hidden(t)[:, -1], x)  # any method, not only forward
    for k in range(len(SEEDS)):
        m = ens.member(k)
        torch.testing.assert_close(out[k], m(x[k]), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(shared[k], m(x[0]), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(hidden[k], m.hidden(x[k])[:, -1], atol=1e-5, rtol=1e-5)
    assert out.shape == (3, 3, 7, TT_CFG.vocab_size)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("n", [11, 12])  # 12 % 4 == 0: RandomSampler's trailing draw depends on the consumer
@pytest.mark.parametrize("consume", ["exhaust", "stop_at_len"])  # a for loop / Lightning's fetcher
def test_seed_batches_follow_each_seeds_dataloader(drop_last, n, consume):
    B, seeds = 4, [5, 0, 5, 17]  # equal seeds give equal orders (arms of one seed)

    def epoch(iterable):
        return list(iterable) if consume == "exhaust" else list(itertools.islice(iter(iterable), len(iterable)))

    sampler = SeedBatchSampler(n, B, seeds, drop_last=drop_last)
    refs = [DataLoader(range(n), batch_size=B, shuffle=True, drop_last=drop_last,
                       generator=torch.Generator().manual_seed(s)) for s in seeds]
    for _ in range(3):  # generators persist across epochs, like a DataLoader's
        got = epoch(sampler)
        for k, ref in enumerate(refs):
            assert [g[k].tolist() for g in got] == [b.tolist() for b in epoch(ref)]
    assert len(sampler) == len(refs[0])
    assert got[0][0].tolist() == got[0][2].tolist() and got[0][0].tolist() != got[0][1].tolist()
    loader = seed_loader({"a": torch.arange(n) * 10, "b": torch.arange(n)[:, None].float()}, B, [1, 2])
    batch = next(iter(loader))
    assert batch["a"].shape == (2, B) and batch["b"].shape == (2, B, 1)
    assert torch.equal(batch["a"], batch["b"][..., 0].long() * 10)


def test_member_export_round_trips_and_global_rng_untouched():
    torch.manual_seed(7)
    before = torch.get_rng_state()
    ens = SeedEnsemble(make_mlp, SEEDS)
    assert torch.equal(torch.get_rng_state(), before)  # building members does not move the global RNG
    for k, s in enumerate(SEEDS):  # member k starts where a solo run of seed k starts
        torch.manual_seed(s)
        solo = make_mlp(s)
        for name, t in solo.state_dict().items():
            assert torch.equal(ens.member_state_dict(k)[name], t)
    # import seed 11's state into member 0, export it, load it into a fresh module: same function
    state = {n: t + 0.5 for n, t in ens.member_state_dict(1).items()}
    ens.load_member_state_dict(0, state)
    out = ens.member_state_dict(0)
    assert out.keys() == state.keys() and all(torch.equal(out[n], state[n]) for n in state)
    fresh = solo_model(make_mlp, 999)
    fresh.load_state_dict(out)
    x = torch.randn(len(SEEDS), 4, 5, dtype=torch.float64)
    torch.testing.assert_close(ens(x)[0], fresh(x[0]))
    assert ens.member(-1).state_dict().keys() == out.keys()
    sd = ens.state_dict()  # the ensemble's own checkpoint: model names with a leading seed dim
    assert sd["stacked.0.weight"].shape == (len(SEEDS), 16, 5)


def test_per_member_clip_matches_torch_per_member():
    ens = SeedEnsemble(make_mlp, SEEDS)
    x, y = mlp_data(6)
    ens.vmap(mlp_loss, (x, y), shared=True).sum().backward()
    grads = [{n: p.grad[k].clone() for n, p in ens.named_stacked_parameters()} for k in range(len(SEEDS))]
    norms = clip_grad_norm_per_member(ens, 0.05)
    for k in range(len(SEEDS)):
        solo = ens.member(k)
        for n, p in solo.named_parameters():
            p.grad = grads[k][n].clone()
        want = torch.nn.utils.clip_grad_norm_(solo.parameters(), 0.05)
        torch.testing.assert_close(norms[k], want.to(norms.dtype))
        for n, p in solo.named_parameters():
            torch.testing.assert_close(ens.stacked.get_parameter(n).grad[k], p.grad)


# ---------------------------------------------------------------------- bad inputs: clear errors
def test_bad_inputs_are_named():
    ens = SeedEnsemble(make_mlp, SEEDS)
    with pytest.raises(ValueError, match=r"argument 0: an ensemble of 3 seeds .* got shape \(2, 4, 5\)"):
        ens(torch.zeros(2, 4, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"argument 0\[1\]: .*got shape \(4,\)"):
        ens.vmap(mlp_loss, (torch.zeros(3, 4, 5, dtype=torch.float64), torch.zeros(4, dtype=torch.long)))
    with pytest.raises(ValueError, match="at least one seed"):
        SeedEnsemble(make_mlp, [])
    with pytest.raises(TypeError, match=r"seeds\[1\]: expected an int"):
        SeedEnsemble(make_mlp, [1, 2.5])
    with pytest.raises(ValueError, match=r"member 1 \(seed 4\): parameter 'weight' is \(5, 5\).*member 0 has \(4, 5\)"):
        SeedEnsemble(lambda s: nn.Linear(5, s + 1), [3, 4])
    with pytest.raises(ValueError, match="running statistics"):
        SeedEnsemble(lambda s: nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)), [0, 1])
    with pytest.raises(IndexError, match=r"members 0..2"):
        ens.member(3)
    with pytest.raises(RuntimeError, match="size mismatch|Missing key|Unexpected key"):
        ens.load_member_state_dict(0, {"0.weight": torch.zeros(2, 2)})
    drop = SeedEnsemble(lambda s: nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5)), [0, 1])
    with pytest.raises(RuntimeError, match="random op"):
        drop(torch.zeros(2, 4, 3))
    with pytest.raises(ValueError, match="batch_size 9 > 4 items"):
        SeedBatchSampler(4, 9, [0], drop_last=True)
    with pytest.raises(ValueError, match="same first dimension"):
        seed_loader((torch.zeros(5, 2), torch.zeros(4)), 2, [0])


def test_non_elementwise_optimizer_and_wrong_batch_refused():
    arm = Arm(make_mlp, SEEDS, mlp_loss)
    arm.make_optimizer = partial(torch.optim.LBFGS, lr=0.1)
    with pytest.raises(ValueError, match="LBFGS is not elementwise"):
        arm.configure_optimizers()
    x, y = mlp_data(8)
    with pytest.raises(ValueError, match="ensemble of 3 seeds"):  # a loader built for other seeds
        arm.ensemble_losses(next(iter(seed_loader((x, y), 4, [1, 2]))))


def test_shared_batch_sgd_momentum_and_param_groups_equal_solo():
    """Full-batch GD (every member sees the same batch), SGD with momentum and per-name param groups
    (no weight decay on biases and norms), gradient clipping by value: member k == solo seed k."""
    x, y = mlp_data(10)

    def groups(named):
        named = list(named)
        return [{"params": [p for n, p in named if n.endswith("weight") and not n.startswith("2.")], "weight_decay": 0.05},
                {"params": [p for n, p in named if not (n.endswith("weight") and not n.startswith("2."))], "weight_decay": 0.0}]

    sgd = partial(torch.optim.SGD, lr=0.2, momentum=0.9)

    class FullBatch(EnsembleModule):
        shared_batch = True

        def member_loss(self, model, batch):
            return mlp_loss(model, batch)

    arm = FullBatch(make_mlp, SEEDS, optimizer=sgd, param_groups=lambda named: groups(named))
    full = DataLoader(TensorDataset(x, y), batch_size=10)  # one batch, the same for every member
    trainer_v = make_trainer(TrainerConfig(max_steps=4, enable_progress_bar=False, gradient_clip_val=0.05),
                             gradient_clip_algorithm="value")
    trainer_v.fit(arm, full)
    bound = False
    for k, s in enumerate(SEEDS):
        torch.manual_seed(s)
        model = make_mlp(s)
        opt = sgd(groups(model.named_parameters()))
        for _ in range(4):
            opt.zero_grad()
            mlp_loss(model, (x, y)).backward()
            bound |= any(bool((p.grad.abs() > 0.05).any()) for p in model.parameters())
            torch.nn.utils.clip_grad_value_(model.parameters(), 0.05)
            opt.step()
        for name, t in model.state_dict().items():
            torch.testing.assert_close(arm.ensemble.member_state_dict(k)[name], t, atol=1e-12, rtol=1e-12)
    assert bound  # the clip changed some gradients
    assert not torch.allclose(arm.ensemble.member_state_dict(0)["0.weight"], solo_model(make_mlp, SEEDS[0])[0].weight)


def test_ensemble_benchmark_runs_a_given_size(tmp_path):
    """`python -m benchmarks.ensemble --size D,L,H,T,B`: one row for that size, member losses equal to solo."""
    import json

    import pytest

    from benchmarks import ensemble as bench

    out = tmp_path / "rows.json"
    assert bench.main(["--size", "16,1,2,8,4", "--seeds", "2", "--steps", "2", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["size"] for r in rows] == ["d=16 L=1 T=8 B=4"] and rows[0]["seeds"] == 2
    assert rows[0]["last_loss_max_abs_diff"] < 1e-5 and rows[0]["cpu_ratio"] > 0
    for bad in ("16,1,2,8", "16,1,3,8,4", "a,1,2,8,4"):
        with pytest.raises(SystemExit):
            bench.main(["--size", bad])
