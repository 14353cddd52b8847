"""sciql.algos against independent brute force (issue 33, mutation testing): the ensemble MLP (init ranges,
layer norm, member independence) rebuilt in numpy per member, the label concatenation, the normaliser's
std floor, the actor set (unconditioned actors see no label, tanh mean, log σ clamp), twin critics and
values, IQL advantages, the kernel call counts and which losses each module trains, ``act``, the
manual-optimisation ``training_step`` (max_steps cut, zero_grad, Polyak per step, learning-curve
snapshots, logging) with a stand-in trainer, and the optimiser's groups and cosine schedule.
Everything here is fast (tiny nets, no Lightning Trainer)."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from stages.sciql import algos


def _np_mlp(net: algos.EnsembleMLP, member: int, x: np.ndarray) -> np.ndarray:
    """One member's forward, with plain numpy (layer norm: eps 1e-5, biased variance)."""
    h = np.asarray(x, dtype=np.float64)
    n = len(net.weights)
    for i in range(n):
        w = net.weights[i][member].detach().double().numpy()
        b = net.biases[i][member, 0].detach().double().numpy()
        h = h @ w + b
        if i < n - 1:
            if net.layer_norm:
                mu = h.mean(-1, keepdims=True)
                var = ((h - mu) ** 2).mean(-1, keepdims=True)
                h = (h - mu) / np.sqrt(var + 1e-5)
                h = h * net.ln_w[i][member, 0].detach().double().numpy() + net.ln_b[i][member, 0].detach().double().numpy()
            h = np.maximum(h, 0.0)
    return h


def _perturb(module, scale=0.3, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


# ---------------------------------------------------------------------------------------------- EnsembleMLP
def test_ensemble_mlp_init_follows_nn_linear_per_member():
    torch.manual_seed(0)
    net = algos.EnsembleMLP(3, 40, 90, 7)
    assert [tuple(w.shape) for w in net.weights] == [(3, 40, 90), (3, 90, 90), (3, 90, 7)]
    assert [tuple(b.shape) for b in net.biases] == [(3, 1, 90), (3, 1, 90), (3, 1, 7)]
    assert not net.layer_norm and not hasattr(net, "ln_w")
    for w, b, fan_in in zip(net.weights, net.biases, (40, 90, 90)):
        bound = fan_in ** -0.5                               # nn.Linear: U(±1/√fan_in) for weight and bias
        assert w.abs().max() <= bound and w.abs().max() > 0.97 * bound
        assert b.abs().max() <= bound and b.abs().max() > 0.8 * bound
        if b.numel() >= 100:                                 # both ends of U(−bound, bound) are reached
            assert b.min() < -0.9 * bound and b.max() > 0.9 * bound
        assert abs(float(w.std()) - bound / math.sqrt(3)) < 0.05 * bound
        assert not torch.equal(w[0], w[1]) and not torch.equal(b[0], b[2])
    deep = algos.EnsembleMLP(2, 5, 6, 1, layers=3, layer_norm=True)
    assert len(deep.weights) == 4 and len(deep.ln_w) == 3 and len(deep.ln_b) == 3
    assert all(torch.equal(p, torch.ones(2, 1, 6)) for p in deep.ln_w)
    assert all(torch.equal(p, torch.zeros(2, 1, 6)) for p in deep.ln_b)


@pytest.mark.parametrize("layer_norm,layers", [(False, 2), (True, 2), (True, 3)])
def test_ensemble_mlp_forward_matches_numpy_per_member(layer_norm, layers):
    torch.manual_seed(1)
    net = algos.EnsembleMLP(3, 4, 6, 5, layers=layers, layer_norm=layer_norm)
    _perturb(net, 0.5)
    x = torch.randn(3, 7, 4) * 2
    out = net(x)
    assert out.shape == (3, 7, 5)
    for m in range(3):
        np.testing.assert_allclose(out[m].detach().numpy(), _np_mlp(net, m, x[m].numpy()), rtol=1e-5, atol=1e-5)
    assert (out < 0).any()                                   # no ReLU after the last layer


def test_with_label_and_normalizer():
    x = torch.arange(6.0).view(1, 2, 3)
    assert algos.with_label(x, torch.tensor([[1, 0]]), 0) is x
    y = algos.with_label(x, torch.tensor([[2, 0]]), 3)
    assert y.tolist() == [[[0, 1, 2, 0, 0, 1], [3, 4, 5, 1, 0, 0]]] and y.dtype == torch.float32
    norm = algos.Normalizer(torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64),
                            torch.tensor([2.0, 0.0, 5e-4], dtype=torch.float64))
    assert norm.mean.dtype == torch.float32 and norm.std.tolist() == pytest.approx([2.0, 1e-3, 1e-3])
    out = norm(torch.tensor([[3.0, -1.0, 0.5015]]))
    assert out.tolist()[0] == pytest.approx([1.0, 1000.0, 1.5], rel=1e-4)
    assert "mean" in dict(norm.named_buffers()) and "std" in dict(norm.named_buffers())
    keep = algos.Normalizer(torch.zeros(2), torch.tensor([1e-3, 2e-3]))
    assert keep.std.tolist() == pytest.approx([1e-3, 2e-3])
    src = torch.ones(2)
    n2 = algos.Normalizer(torch.zeros(2), src)
    src.mul_(4.0)
    assert n2.std.tolist() == [1.0, 1.0]                     # a copy, not a view of the caller's tensor


# ---------------------------------------------------------------------------------------------- networks
def test_actor_set_members_labels_tanh_and_log_std_clamp():
    torch.manual_seed(2)
    E, obs_dim, act_dim, K = 2, 3, 2, 4
    actors = algos.ActorSet({"bc": False, "cbc": True, "gawr": True}, E, obs_dim, act_dim, K, 8)
    assert actors.net.weights[0].shape == (3 * E, obs_dim + K, 8) and actors.net.weights[-1].shape == (3 * E, 8, 2 * act_dim)
    _perturb(actors, 0.8)
    with torch.no_grad():                                   # push some log σ outside [−5, 1] (both ends)
        actors.net.biases[-1][:, 0, act_dim] += 20.0
        actors.net.biases[-1][:, 0, act_dim + 1] -= 20.0
    obs = torch.randn(E, 5, obs_dim)
    lab_c, lab_g = torch.randint(0, K, (E, 5)), torch.randint(0, K, (E, 5))
    out = actors(obs, {"cbc": lab_c, "gawr": lab_g})
    assert set(out) == {"bc", "cbc", "gawr"}
    for a, name in enumerate(("bc", "cbc", "gawr")):
        mu, log_std = out[name]
        for e in range(E):
            lab = {"bc": None, "cbc": lab_c, "gawr": lab_g}[name]
            onehot = np.zeros((5, K)) if lab is None else np.eye(K)[lab[e].numpy()]
            raw = _np_mlp(actors.net, a * E + e, np.concatenate([obs[e].numpy(), onehot], -1))
            np.testing.assert_allclose(mu[e].detach().numpy(), np.tanh(raw[:, :act_dim]), rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(log_std[e].detach().numpy(), np.clip(raw[:, act_dim:], -5.0, 1.0),
                                       rtol=1e-5, atol=1e-5)
            assert raw[:, act_dim].min() > 1.0 and raw[:, act_dim + 1].max() < -5.0   # both clamps bind
    assert algos.LOG_STD_MIN == -5.0 and algos.LOG_STD_MAX == 1.0


def test_twin_critic_value_and_iql_advantage_match_numpy():
    torch.manual_seed(3)
    E, K = 2, 3
    iql = algos.IQL(E, 3, 2, K, 6)
    assert iql.critic.qs.layer_norm and iql.value.net.layer_norm
    assert not any(p.requires_grad for p in iql.target.parameters())
    assert all(p.requires_grad for p in iql.critic.parameters())
    assert iql.critic.qs.weights[0].shape[0] == 2 * E and iql.value.net.weights[0].shape[0] == E
    for mod in (iql.critic, iql.value):
        _perturb(mod, 0.4, 1)
    _perturb(iql.target, 0.4, 2)
    obs, act, z = torch.randn(E, 4, 3), torch.rand(E, 4, 2) * 2 - 1, torch.randint(0, K, (E, 4))
    q = iql.critic(obs, act, z)
    v = iql.value(obs, z)
    adv = iql.advantage(obs, act, z)
    assert q.shape == (2, E, 4) and v.shape == (E, 4) and adv.shape == (E, 4)
    for e in range(E):
        x = np.concatenate([obs[e].numpy(), act[e].numpy(), np.eye(K)[z[e].numpy()]], -1)
        xv = np.concatenate([obs[e].numpy(), np.eye(K)[z[e].numpy()]], -1)
        q_np = [_np_mlp(iql.critic.qs, t * E + e, x)[:, 0] for t in (0, 1)]    # member = twin·E + seed
        qt_np = [_np_mlp(iql.target.qs, t * E + e, x)[:, 0] for t in (0, 1)]
        v_np = _np_mlp(iql.value.net, e, xv)[:, 0]
        for t in (0, 1):
            np.testing.assert_allclose(q[t, e].detach().numpy(), q_np[t], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(v[e].detach().numpy(), v_np, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(adv[e].numpy(), np.minimum(*qt_np) - v_np, rtol=1e-5, atol=1e-5)
    plain = algos.Value(1, 3, 0, 5)
    assert plain(torch.randn(1, 4, 3)).shape == (1, 4)


def test_iql_losses_unstyled_branch_and_terminal_mask_by_hand():
    """Task IQL (no label): value expectile on min target twin, TD target with the terminal mask, A = Q' − V."""
    torch.manual_seed(4)
    E, B, tau, gamma = 2, 6, 0.8, 0.9
    iql = algos.IQL(E, 3, 2, 0, 6)
    _perturb(iql.value, 0.5, 3)
    _perturb(iql.target, 0.6, 4)
    obs, act, nxt = torch.randn(E, B, 3), torch.rand(E, B, 2), torch.randn(E, B, 3)
    r = torch.tensor([[1.0, -2.0, 0.5, 0.0, 3.0, -1.0], [0.2, 0.4, -0.6, 1.0, -1.5, 2.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0, 0.0, 1.0]] * 2)
    vl, cl, adv = iql.losses(obs, act, nxt, r, mask, None, tau, gamma, backend="torch")
    exp_v = exp_c = 0.0
    for e in range(E):
        x = np.concatenate([obs[e].numpy(), act[e].numpy()], -1)
        qt = np.minimum(*[_np_mlp(iql.target.qs, t * E + e, x)[:, 0] for t in (0, 1)])
        v = _np_mlp(iql.value.net, e, obs[e].numpy())[:, 0]
        nv = _np_mlp(iql.value.net, e, nxt[e].numpy())[:, 0]
        u = qt - v
        exp_v += np.mean(np.where(u < 0, 1 - tau, tau) * u ** 2)
        y = r[e].numpy() + gamma * mask[e].numpy() * nv
        for t in (0, 1):
            exp_c += np.mean((_np_mlp(iql.critic.qs, t * E + e, x)[:, 0] - y) ** 2)
        np.testing.assert_allclose(adv[e].detach().numpy(), u, rtol=1e-5, atol=1e-5)
    assert float(vl) == pytest.approx(exp_v, rel=1e-5)
    assert float(cl) == pytest.approx(exp_c, rel=1e-5)
    assert not adv.requires_grad


# ---------------------------------------------------------------------------------------------- modules
def _batch(E=2, B=6, K=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    cur = torch.randint(0, K, (E, B), generator=g)
    return {"obs": torch.randn(E, B, 3, generator=g), "next_obs": torch.randn(E, B, 3, generator=g),
            "action": torch.rand(E, B, 2, generator=g) * 1.6 - 0.8, "reward": torch.randn(E, B, generator=g),
            "mask": torch.ones(E, B), "cur_label": cur, "value_label": torch.randint(0, K, (E, B), generator=g),
            "actor_label": torch.randint(0, K, (E, B), generator=g)}


def _make(cls, E=2, **kw):
    return cls(obs_dim=3, act_dim=2, num_labels=3, obs_mean=torch.zeros(3), obs_std=torch.ones(3), n_seeds=E,
               hidden=8, **kw)


def test_module_defaults_are_the_papers_hyperparameters():
    m = algos.SCIQL(obs_dim=3, act_dim=2, num_labels=3, obs_mean=torch.zeros(3), obs_std=torch.ones(3))
    hp = dict(m.hparams)
    assert hp == dict(obs_dim=3, act_dim=2, num_labels=3, n_seeds=1, hidden=64, lr=1e-3, expectile=0.7,
                      discount=0.99, polyak=0.005, beta=3.0, clip=100.0, max_steps=1000, curve_every=0)
    assert m.kernel_backend == "auto" and m.kernel_calls == {"gawr_actor_loss": 0, "expectile_loss": 0}
    assert m.curve == [] and m.snapshots == {} and m.automatic_optimization is False
    assert m.style.critic.qs.weights[1].shape == (2, 64, 64)
    assert m.style.critic.qs.weights[0].shape == (2, 3 + 2 + 3, 64) and m.task.critic.qs.weights[0].shape == (2, 5, 64)
    assert m.policies.net.weights[0].shape == (2, 3 + 3, 64)


@pytest.mark.parametrize("cls,losses,calls", [
    (algos.BC, {"actor_bc"}, (1, 0)),
    (algos.CBC, {"actor_cbc"}, (1, 0)),
    (algos.TaskIQL, {"task_value", "task_critic", "actor_task_iql"}, (1, 1)),
    (algos.SCIQL, {"style_value", "style_critic", "task_value", "task_critic", "actor_sciql", "actor_gawr"}, (2, 2)),
    (algos.SCIQLSuite, {"style_value", "style_critic", "task_value", "task_critic", "actor_bc", "actor_cbc",
                        "actor_sciql", "actor_gawr", "actor_task_iql"}, (5, 2)),
])
def test_each_module_trains_its_losses_and_counts_kernel_calls(cls, losses, calls):
    m = _make(cls)
    m.kernel_backend = "torch"
    out = m.compute_losses(_batch())
    assert set(out) == losses
    assert m.kernel_calls == {"gawr_actor_loss": calls[0], "expectile_loss": calls[1]}
    m.compute_losses(_batch(seed=1))
    assert m.kernel_calls == {"gawr_actor_loss": 2 * calls[0], "expectile_loss": 2 * calls[1]}
    assert hasattr(m, "style") == cls.style_iql and hasattr(m, "task") == cls.task_iql
    assert algos.MODULES[{algos.BC: "bc", algos.CBC: "cbc", algos.TaskIQL: "task_iql", algos.SCIQL: "sciql",
                          algos.SCIQLSuite: "suite"}[cls]] is cls


def test_bc_and_cbc_losses_are_plain_gaussian_nll_by_hand():
    """β = 0: weight 1 whatever the advantages; CBC sees the current label, BC none; the loss is E·mean NLL."""
    E, B = 2, 6
    batch = _batch(E, B)
    for cls, name, lab in ((algos.BC, "bc", None), (algos.CBC, "cbc", batch["cur_label"])):
        m = _make(cls, E, beta=2.5)
        m.kernel_backend = "torch"
        _perturb(m.policies, 0.5, 5)
        loss = m.compute_losses(batch)[f"actor_{name}"]
        exp = 0.0
        for e in range(E):
            onehot = np.zeros((B, 3)) if lab is None else np.eye(3)[lab[e].numpy()]
            raw = _np_mlp(m.policies.net, e, np.concatenate([batch["obs"][e].numpy(), onehot], -1))
            mu, ls = np.tanh(raw[:, :2]), np.clip(raw[:, 2:], -5, 1)
            a = batch["action"][e].numpy()
            logp = (-0.5 * ((a - mu) / np.exp(ls)) ** 2 - ls - 0.5 * np.log(2 * np.pi)).sum(-1)
            exp += -logp.mean()
        assert float(loss) == pytest.approx(exp, rel=1e-5)


def test_act_is_one_seeds_mean_action():
    torch.manual_seed(5)
    E = 3
    mean, std = torch.tensor([1.0, -0.5, 2.0]), torch.tensor([2.0, 0.5, 4.0])
    m = algos.SCIQLSuite(obs_dim=3, act_dim=2, num_labels=3, obs_mean=mean, obs_std=std, n_seeds=E, hidden=8)
    _perturb(m.policies, 0.6, 6)
    obs = torch.randn(4, 3) * 3
    label = torch.tensor([2, 0, 1, 2])
    names = list(m.actors)
    on = ((obs - mean) / std).numpy()
    for name, lab in (("gawr", label), ("cbc", label), ("bc", None), ("task_iql", None), ("sciql", None)):
        for s in (0, 2):
            got = m.act(name, obs, lab, s)
            cond = m.actors[name][0]
            onehot = np.eye(3)[(lab if lab is not None else torch.zeros(4, dtype=torch.long)).numpy()] if cond \
                else np.zeros((4, 3))
            raw = _np_mlp(m.policies.net, names.index(name) * E + s, np.concatenate([on, onehot], -1))
            np.testing.assert_allclose(got.numpy(), np.tanh(raw[:, :2]), rtol=1e-5, atol=1e-5)
    assert algos.METHODS == ("bc", "cbc", "sciql", "gawr", "task_iql")


# ---------------------------------------------------------------------------------------------- training_step
class _Opt:
    """Stands in for Lightning's wrapped optimizer: records the gradients at each step, counts the global
    step (as LightningOptimizer.step does) and optionally applies a real update."""

    def __init__(self, module, trainer, real=None):
        self.module, self.trainer, self.real, self.grads, self.zeroed = module, trainer, real, [], 0

    def zero_grad(self):
        self.zeroed += 1
        self.module.zero_grad(set_to_none=True)

    def step(self):
        self.grads.append({n: (p.grad.clone() if p.grad is not None else None)
                           for n, p in self.module.named_parameters()})
        if self.real is not None:
            self.real.step()
        self.trainer.global_step += 1


def _attach(m, start=0, real=False):
    trainer = SimpleNamespace(global_step=start)
    m._trainer = trainer
    real_opt = m.configure_optimizers()["optimizer"] if real else None
    opt = _Opt(m, trainer, real_opt)
    sched = SimpleNamespace(n=0)
    sched.step = lambda: setattr(sched, "n", sched.n + 1)
    logged = []
    m.optimizers = lambda: opt
    m.lr_schedulers = lambda: sched
    m.manual_backward = lambda loss: loss.backward()
    m.log_dict = lambda d, **kw: logged.append((d, kw))
    polyaks = []
    for sys in ("style", "task"):
        if hasattr(m, sys):
            getattr(m, sys).polyak = lambda rho, sys=sys: polyaks.append((sys, rho, trainer.global_step))
    return opt, sched, logged, polyaks


def _stack(batches):
    return {k: torch.stack([b[k] for b in batches]) for k in batches[0]}


def test_training_step_one_adam_step_per_inner_batch_with_fresh_gradients():
    E = 2
    m = _make(algos.SCIQL, E, max_steps=50, polyak=0.02)
    m.kernel_backend = "torch"
    opt, sched, logged, polyaks = _attach(m)
    b = _batch(E)
    m.training_step(_stack([b, b, b]), 0)
    assert m.trainer.global_step == 3 and sched.n == 3 and opt.zeroed == 3 and len(opt.grads) == 3
    assert polyaks == [("style", 0.02, 1), ("task", 0.02, 1), ("style", 0.02, 2), ("task", 0.02, 2),
                       ("style", 0.02, 3), ("task", 0.02, 3)]
    m.zero_grad(set_to_none=True)
    losses = m.compute_losses(b)
    sum(losses.values()).backward()                     # the step's gradient: of the sum of all losses
    for grads in opt.grads:                              # same batch, no update: identical (zeroed) gradients
        for n, p in m.named_parameters():
            if p.grad is None:
                assert grads[n] is None, n
            else:
                torch.testing.assert_close(grads[n], p.grad, msg=n)
    (d, kw), = logged
    assert kw == {"prog_bar": False}
    assert set(d) == {f"loss/{k}" for k in losses}
    for k, v in losses.items():
        assert float(d[f"loss/{k}"]) == pytest.approx(float(v) / E, rel=1e-5)
    assert m.curve == [] and m.snapshots == {}


def test_training_step_stops_at_max_steps_and_records_curves():
    E = 2
    m = _make(algos.SCIQL, E, max_steps=5, curve_every=2, lr=0.01)
    m.kernel_backend = "torch"
    opt, sched, logged, polyaks = _attach(m, start=0, real=True)
    batches = [_batch(E, seed=s) for s in range(4)]
    m.training_step(_stack(batches[:3]), 0)             # steps 1, 2, 3
    assert m.trainer.global_step == 3 and [c["step"] for c in m.curve] == [2]
    m.training_step(_stack(batches), 1)                  # steps 4, 5, then max_steps reached: stop
    assert m.trainer.global_step == 5 and sched.n == 5 and len(polyaks) == 10
    assert [c["step"] for c in m.curve] == [2, 4, 5] and sorted(m.snapshots) == [2, 4, 5]
    assert set(m.curve[0]) == {"step", "style_value", "style_critic", "task_value", "task_critic", "actor_sciql",
                               "actor_gawr"}
    # the curve holds per-seed losses: the step's loss sum / n_seeds; the last one equals what was logged
    (d_last, _) = logged[-1]
    for k, v in d_last.items():
        assert m.curve[-1][k.removeprefix("loss/")] == pytest.approx(float(v), rel=1e-6)
    cur = m.policies.state_dict()
    assert set(m.snapshots[5]) == set(cur)
    assert all(torch.equal(m.snapshots[5][k], cur[k]) for k in cur)
    assert any(not torch.equal(m.snapshots[2][k], cur[k]) for k in cur)   # copies, taken at their step
    m2 = _make(algos.BC, E, max_steps=5)
    m2.kernel_backend = "torch"
    opt2, *_ = _attach(m2, start=4)
    m2.training_step(_stack(batches[:3]), 0)
    assert m2.trainer.global_step == 5 and len(opt2.grads) == 1 and m2.curve == []
    m3 = _make(algos.BC, E, max_steps=5)
    m3.kernel_backend = "torch"
    opt3, *_ = _attach(m3, start=7)
    m3.training_step(_stack(batches[:2]), 0)            # the first inner step always runs
    assert len(opt3.grads) == 1


def test_curve_records_only_on_multiples_and_the_last_step():
    m = _make(algos.BC, 1, max_steps=7, curve_every=3)
    m.kernel_backend = "torch"
    _attach(m)
    b = _batch(1)
    for _ in range(3):
        m.training_step(_stack([b, b, b]), 0)
    assert m.trainer.global_step == 7 and [c["step"] for c in m.curve] == [3, 6, 7]


# ---------------------------------------------------------------------------------------------- optimiser
def test_optimizer_groups_and_cosine_actor_schedule():
    m = _make(algos.SCIQL, 2, lr=0.003, max_steps=40)
    cfg = m.configure_optimizers()
    opt, sched = cfg["optimizer"], cfg["lr_scheduler"]["scheduler"]
    assert isinstance(opt, torch.optim.Adam) and cfg["lr_scheduler"]["interval"] == "step"
    actor_ids = {id(p) for p in m.policies.parameters()}
    g0, g1 = opt.param_groups
    assert {id(p) for p in g0["params"]} == actor_ids
    other = {id(p) for p in g1["params"]}
    assert other == {id(p) for n, p in m.named_parameters() if not n.startswith("policies.") and ".target." not in n}
    assert not other & {id(p) for p in m.style.target.parameters()}
    assert g0["lr"] == g1["lr"] == pytest.approx(0.003)
    lam_a, lam_c = sched.lr_lambdas
    for s, want in ((0, 1.0), (10, 0.5 * (1 + math.cos(math.pi / 4))), (20, 0.5), (40, 0.0), (55, 0.0)):
        assert lam_a(s) == pytest.approx(want, abs=1e-12)
        assert lam_c(s) == 1.0
    bc = _make(algos.BC, 2, max_steps=0)
    cfg = bc.configure_optimizers()
    assert len(cfg["optimizer"].param_groups) == 1
    (lam,) = cfg["lr_scheduler"]["scheduler"].lr_lambdas
    assert lam(0) == 1.0 and lam(1) == pytest.approx(0.0, abs=1e-12)      # T = max(1, max_steps)
    sched.step()
    assert opt.param_groups[1]["lr"] == pytest.approx(0.003)


# ---------------------------------------------------------------------------------------------- device
def test_losses_and_actions_stay_on_the_inputs_device():
    """On the meta device every tensor the module creates must follow its inputs: an implicit CPU tensor
    (a dropped ``device=``) raises 'Tensor on device cpu is not on the expected device meta'."""
    m = _make(algos.SCIQLSuite, 2).to("meta")
    m.kernel_backend = "torch"
    batch = {k: v.to("meta") for k, v in _batch().items()}
    out = m.compute_losses(batch)
    assert all(v.device.type == "meta" and v.shape == () for v in out.values())
    assert m.act("task_iql", torch.zeros(4, 3, device="meta"), None, 1).device.type == "meta"
    assert m.act("gawr", torch.zeros(4, 3, device="meta"), torch.zeros(4, dtype=torch.long, device="meta"),
                 0).shape == (4, 2)


def test_unlabelled_module_gives_actors_one_blank_label_column():
    """num_labels = 0 (no style labels): the actors still get one (all-zero) label column."""
    m = algos.BC(obs_dim=3, act_dim=2, num_labels=0, obs_mean=torch.zeros(3), obs_std=torch.ones(3), hidden=8)
    assert m.policies.net.weights[0].shape == (1, 3 + 1, 8) and m.policies.num_labels == 1
    m.kernel_backend = "torch"
    b = _batch(1)
    assert set(m.compute_losses(b)) == {"actor_bc"}
    raw = _np_mlp(m.policies.net, 0, np.concatenate([b["obs"][0].numpy(), np.zeros((6, 1))], -1))
    np.testing.assert_allclose(m.act("bc", b["obs"][0], None, 0).numpy(), np.tanh(raw[:, :2]), rtol=1e-5, atol=1e-5)


def test_every_kernel_call_uses_the_stages_backend(monkeypatch):
    """The train stage sets ``kernel_backend`` from its KernelRecord; every loss kernel call must use it."""
    seen = []

    def spy(fn):
        def wrapped(*a, **kw):
            seen.append((fn.__name__, kw.get("backend")))
            return fn(*a, **kw)
        return wrapped

    monkeypatch.setattr(algos, "expectile_loss", spy(algos.expectile_loss))
    monkeypatch.setattr(algos, "gawr_actor_loss", spy(algos.gawr_actor_loss))
    m = _make(algos.SCIQLSuite, 2)
    m.kernel_backend = "torch"
    m.compute_losses(_batch())
    assert sorted(seen) == sorted([("expectile_loss", "torch")] * 2 + [("gawr_actor_loss", "torch")] * 5)


def test_actor_set_splits_mean_and_log_std_for_odd_action_dims():
    """act_dim = 3: the head's 6 outputs are μ (first 3) and log σ (last 3), per actor member."""
    torch.manual_seed(7)
    actors = algos.ActorSet({"bc": False, "sciql": True}, 1, 2, 3, 2, 5)
    _perturb(actors, 0.5, 8)
    obs, lab = torch.randn(1, 4, 2), torch.tensor([[0, 1, 1, 0]])
    out = actors(obs, {"sciql": lab})
    for a, name in enumerate(("bc", "sciql")):
        mu, log_std = out[name]
        assert mu.shape == log_std.shape == (1, 4, 3)
        onehot = np.zeros((4, 2)) if name == "bc" else np.eye(2)[lab[0].numpy()]
        raw = _np_mlp(actors.net, a, np.concatenate([obs[0].numpy(), onehot], -1))
        np.testing.assert_allclose(mu[0].detach().numpy(), np.tanh(raw[:, :3]), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(log_std[0].detach().numpy(), np.clip(raw[:, 3:], -5, 1), rtol=1e-5, atol=1e-5)
