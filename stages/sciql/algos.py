"""SCIQL and its baselines as LightningModules (CleanRL-style: the algorithm reads top to bottom).

    BC       π(a|s)      weight 1                                   (behaviour cloning)
    CBC      π(a|s,z)    weight 1, z = current label                (label-conditioned BC)
    TaskIQL  π(a|s)      IQL on the task reward, AWR weight min(exp(3 A_r), 100)
    SCIQL    π(a|s,z)    per-style IQL on r_z = 1[label_t = z] − 1 (hindsight-relabelled z) + a task
                         IQL, and two actors on those critics: "sciql" (style only, A = A_z) and
                         "gawr" (A = A_z + σ(A_z)·A_r)
    SCIQLSuite           SCIQL plus the BC, CBC and task-only actors in one module: every actor sees the
                         same batches; the task-only actor uses the same task IQL as GAWR.

Seeds are vectorised: every network is an ensemble over ``n_seeds`` independent members (own init,
own data batch; batches have a leading seed dim), evaluated with batched matmuls. Each loss is the
sum over members of the member's mean loss, so each member gets exactly its own gradient and Adam
(elementwise) keeps the members independent — n_seeds training runs for the price of ~one.

All of a module's networks take one Adam step on the sum of their losses (the cross terms are
detached — value targets, TD targets and AWR weights carry no gradient — so each network receives
its own IQL/AWR gradient, as in separate updates). Target critics follow Polyak averaging
θ' ← (1−ρ)θ' + ρθ after each step. Actor and value losses go through kernels.gawr_loss.
"""
from __future__ import annotations

import copy
import math

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

from kernels.gawr_loss import expectile_loss, gawr_actor_loss

LOG_STD_MIN, LOG_STD_MAX = -5.0, 1.0


class EnsembleMLP(nn.Module):
    """M independent 2-hidden-layer MLPs with batched matmuls: (M, B, in) -> (M, B, out)."""

    def __init__(self, members: int, inp: int, hidden: int, out: int, layers: int = 2, layer_norm: bool = False):
        super().__init__()
        dims = [inp] + [hidden] * layers + [out]
        self.weights, self.biases = nn.ParameterList(), nn.ParameterList()
        for d_in, d_out in zip(dims[:-1], dims[1:]):
            w = torch.empty(members, d_in, d_out)
            for m in range(members):  # nn.Linear's default init, per member
                nn.init.kaiming_uniform_(w[m].T, a=math.sqrt(5))
            self.weights.append(nn.Parameter(w))
            self.biases.append(nn.Parameter(torch.empty(members, 1, d_out).uniform_(-d_in ** -0.5, d_in ** -0.5)))
        self.layer_norm = layer_norm
        if layer_norm:
            self.ln_w = nn.ParameterList([nn.Parameter(torch.ones(members, 1, hidden)) for _ in range(layers)])
            self.ln_b = nn.ParameterList([nn.Parameter(torch.zeros(members, 1, hidden)) for _ in range(layers)])

    def forward(self, x):                                   # x: (M, B, in)
        h = x
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            h = torch.baddbmm(b, h, w)                      # (M, B, out_i)
            if i < last:
                if self.layer_norm:
                    h = F.layer_norm(h, h.shape[-1:]) * self.ln_w[i] + self.ln_b[i]
                h = F.relu(h)
        return h


def with_label(x, label, num_labels):
    """Concatenate the one-hot style label (if the network is conditioned)."""
    return x if not num_labels else torch.cat([x, F.one_hot(label, num_labels).float()], -1)


class Normalizer(nn.Module):
    def __init__(self, mean: torch.Tensor, std: torch.Tensor):
        super().__init__()
        self.register_buffer("mean", mean.float().clone())
        self.register_buffer("std", std.float().clamp_min(1e-3).clone())

    def forward(self, x):
        return (x - self.mean) / self.std


class ActorSet(nn.Module):
    """Several Gaussian actors π(a | s [, z]) = N(tanh(μ), exp(log σ)²), one member per (actor, seed),
    evaluated as one ensemble. An unconditioned actor gets an all-zero label input (= no label)."""

    def __init__(self, conditioned: dict[str, bool], seeds: int, obs_dim: int, act_dim: int, num_labels: int,
                 hidden: int):
        super().__init__()
        self.conditioned, self.seeds, self.num_labels = dict(conditioned), seeds, num_labels
        self.net = EnsembleMLP(len(conditioned) * seeds, obs_dim + num_labels, hidden, 2 * act_dim)

    def forward(self, obs_n, labels: dict):
        """obs_n (E, B, obs); labels[name] (E, B) for conditioned actors -> {name: (mu, log_std)} (E, B, act)."""
        xs = []
        for name, cond in self.conditioned.items():
            lab = (F.one_hot(labels[name], self.num_labels).float() if cond
                   else obs_n.new_zeros(*obs_n.shape[:2], self.num_labels))
            xs.append(torch.cat([obs_n, lab], -1))
        out = self.net(torch.cat(xs, 0)).split(self.seeds, 0)              # per actor: (E, B, 2·act)
        res = {}
        for name, o in zip(self.conditioned, out):
            mu, log_std = o.chunk(2, -1)
            res[name] = (torch.tanh(mu), log_std.clamp(LOG_STD_MIN, LOG_STD_MAX))
        return res


class TwinCritic(nn.Module):
    """Q1, Q2 (s, a [, z]) per seed: 2E ensemble members; output (2, E, B)."""

    def __init__(self, seeds: int, obs_dim: int, act_dim: int, num_labels: int, hidden: int):
        super().__init__()
        self.num_labels, self.seeds = num_labels, seeds
        self.qs = EnsembleMLP(2 * seeds, obs_dim + act_dim + num_labels, hidden, 1, layer_norm=True)

    def forward(self, obs_n, action, label=None):
        x = with_label(torch.cat([obs_n, action], -1), label, self.num_labels)   # (E, B, in)
        q = self.qs(x.repeat(2, 1, 1)).squeeze(-1)                                 # (2E, B)
        return q.view(2, self.seeds, -1)


class Value(nn.Module):
    def __init__(self, seeds: int, obs_dim: int, num_labels: int, hidden: int):
        super().__init__()
        self.num_labels = num_labels
        self.net = EnsembleMLP(seeds, obs_dim + num_labels, hidden, 1, layer_norm=True)

    def forward(self, obs_n, label=None):                   # (E, B)
        return self.net(with_label(obs_n, label, self.num_labels)).squeeze(-1)


class IQL(nn.Module):
    """One IQL value system: twin critics, their Polyak target, and an expectile value."""

    def __init__(self, seeds, obs_dim, act_dim, num_labels, hidden):
        super().__init__()
        self.critic = TwinCritic(seeds, obs_dim, act_dim, num_labels, hidden)
        self.target = copy.deepcopy(self.critic).requires_grad_(False)
        self.value = Value(seeds, obs_dim, num_labels, hidden)

    def losses(self, obs, act, next_obs, reward, mask, label, expectile, discount, adv_label=None,
               backend: str = "auto"):
        """Value (expectile) and critic (TD) losses at ``label``, plus the advantage A = Q' − V used by
        the actor at ``adv_label`` (same rows; computed in the same batched forwards). Inputs (E, B, ...)."""
        E, B = obs.shape[:2]
        styled = label is not None
        cat = lambda *xs: torch.cat(xs, 1)                                  # along the batch dim
        with torch.no_grad():
            if styled:  # one target forward for the value target (label) and the actor advantage (adv_label)
                q_target, q_adv = self.target(cat(obs, obs), cat(act, act), cat(label, adv_label)).min(0).values.split(B, 1)
            else:
                q_target = q_adv = self.target(obs, act).min(0).values     # min(Q1', Q2')
        if styled:
            v, next_v, v_adv = self.value(cat(obs, next_obs, obs), cat(label, label, adv_label)).split(B, 1)
        else:
            v, next_v = self.value(cat(obs, next_obs)).split(B, 1)
            v_adv = v
        next_v = next_v.detach()
        td_target = reward + discount * mask * next_v                     # ALGO: r + γ·mask·V(s')
        value_loss = E * expectile_loss(q_target.reshape(-1), v.reshape(-1), expectile,
                                        backend=backend)                  # ALGO: expectile τ
        q = self.critic(obs, act, label)                                  # (2, E, B)
        critic_loss = ((q - td_target) ** 2).mean(-1).sum()              # both twins, every seed
        advantage = q_adv - v_adv.detach()                                # ALGO: A = Q − V (no gradient)
        return value_loss, critic_loss, advantage

    @torch.no_grad()
    def advantage(self, obs, act, label=None):
        return self.target(obs, act, label).min(0).values - self.value(obs, label)   # A = Q − V

    @torch.no_grad()
    def polyak(self, rho: float):
        # ALGO: Polyak θ' ← (1−ρ)θ' + ρθ
        torch._foreach_lerp_(list(self.target.parameters()), list(self.critic.parameters()), rho)


class OfflinePolicyModule(L.LightningModule):
    """Shared machinery; subclasses declare which IQL systems and which actors they train.

    ``actors`` maps an actor name to (conditioned on z?, advantage mode) with mode in
    {"bc", "style", "gawr", "task"}; "bc" uses weight 1 (β = 0). Batches carry a leading seed dim.
    """

    style_iql = False
    task_iql = False
    actors: dict[str, tuple[bool, str]] = {}

    def __init__(self, obs_dim: int, act_dim: int, num_labels: int, obs_mean, obs_std, n_seeds: int = 1,
                 hidden: int = 64, lr: float = 1e-3, expectile: float = 0.7, discount: float = 0.99,
                 polyak: float = 0.005, beta: float = 3.0, clip: float = 100.0, max_steps: int = 1000,
                 curve_every: int = 0):
        super().__init__()
        self.kernel_backend = "auto"   # the train stage sets KernelRecord.backend here
        self.kernel_calls = {"gawr_actor_loss": 0, "expectile_loss": 0}
        self.curve: list[dict] = []                 # (step, per-seed losses) every curve_every steps
        self.snapshots: dict[int, dict] = {}        # step -> actor weights (learning curves in evaluate)
        self.automatic_optimization = False
        # explicit (not frame inspection, which a wrapped __init__, e.g. under mutmut, defeats)
        self.save_hyperparameters(dict(obs_dim=obs_dim, act_dim=act_dim, num_labels=num_labels, n_seeds=n_seeds,
                                       hidden=hidden, lr=lr, expectile=expectile, discount=discount, polyak=polyak,
                                       beta=beta, clip=clip, max_steps=max_steps, curve_every=curve_every))
        E = n_seeds
        self.norm = Normalizer(torch.as_tensor(obs_mean), torch.as_tensor(obs_std))
        if self.style_iql:
            self.style = IQL(E, obs_dim, act_dim, num_labels, hidden)
        if self.task_iql:
            self.task = IQL(E, obs_dim, act_dim, 0, hidden)
        self.policies = ActorSet({name: cond for name, (cond, _) in self.actors.items()}, E, obs_dim, act_dim,
                                 max(num_labels, 1), hidden)

    # -- acting ------------------------------------------------------------------------------
    @torch.no_grad()
    def act(self, name: str, obs: torch.Tensor, label: torch.Tensor | None, seed_index: int) -> torch.Tensor:
        """Mean action of one seed's actor for obs (N, obs_dim) (and labels (N,))."""
        E = self.hparams.n_seeds
        x = self.norm(obs).unsqueeze(0).expand(E, *obs.shape)
        if label is None:  # an unconditioned actor: the conditioned members just see label 0
            label = torch.zeros(obs.shape[0], dtype=torch.long, device=obs.device)
        labels = {n: label.unsqueeze(0).expand(E, *label.shape) for n, (c, _) in self.actors.items() if c}
        mu, _ = self.policies(x, labels)[name]
        return mu[seed_index]

    # -- one update of every network -----------------------------------------------------------
    def compute_losses(self, batch):
        """batch: dict of (E, B, ...) tensors -> dict of scalar losses (summed over seeds)."""
        hp = self.hparams
        obs, next_obs = self.norm(batch["obs"]), self.norm(batch["next_obs"])
        act, mask = batch["action"], batch["mask"]
        E = act.shape[0]
        losses = {}
        zero = torch.zeros(act.shape[:2], device=act.device)
        a_style = a_task = zero
        if self.style_iql:
            z = batch["value_label"]
            r_style = (batch["cur_label"] == z).float() - 1.0                 # ALGO: r_z = 1[label_t = z] − 1
            losses["style_value"], losses["style_critic"], a_style = self.style.losses(
                obs, act, next_obs, r_style, mask, z, hp.expectile, hp.discount, adv_label=batch["actor_label"],
                backend=self.kernel_backend)
            self.kernel_calls["expectile_loss"] += 1
        if self.task_iql:
            losses["task_value"], losses["task_critic"], a_task = self.task.losses(
                obs, act, next_obs, batch["reward"], mask, None, hp.expectile, hp.discount,
                backend=self.kernel_backend)
            self.kernel_calls["expectile_loss"] += 1
        flat = lambda x: x.reshape(-1, *x.shape[2:])                         # (E, B, ...) -> (E·B, ...)
        labels = {name: batch["actor_label"] if mode in ("style", "gawr") else batch["cur_label"]
                  for name, (cond, mode) in self.actors.items() if cond}
        dists = self.policies(obs, labels)
        for name, (cond, mode) in self.actors.items():
            mu, log_std = dists[name]
            adv_z = a_style if mode in ("style", "gawr") else zero
            adv_r = a_task if mode in ("gawr", "task") else zero
            beta = 0.0 if mode == "bc" else hp.beta
            # ALGO: GAWR  A = A_z + σ(A_z)·A_r,  w = min(exp(β A), 100),  L = −E[w log π(a|s,z)]
            losses[f"actor_{name}"] = E * gawr_actor_loss(flat(mu), flat(log_std), flat(act), flat(adv_z),
                                                          flat(adv_r), beta=beta, clip=hp.clip,
                                                          gated=(mode == "gawr"), backend=self.kernel_backend)
            self.kernel_calls["gawr_actor_loss"] += 1
        return losses

    def training_step(self, batch, batch_idx):
        """Manual optimisation: the stream delivers ``inner`` stacked batches; one Adam step each
        (fewer Lightning round-trips per gradient step; ``max_steps`` counts the Adam steps)."""
        opt, sched = self.optimizers(), self.lr_schedulers()
        inner = batch["obs"].shape[0]
        for i in range(inner):
            if i and self.trainer.global_step >= self.hparams.max_steps:
                break  # exactly max_steps Adam steps even when inner does not divide it
            losses = self.compute_losses({k: v[i] for k, v in batch.items()})
            opt.zero_grad()
            self.manual_backward(sum(losses.values()))
            opt.step()
            sched.step()
            for sys in ("style", "task"):
                if hasattr(self, sys):
                    getattr(self, sys).polyak(self.hparams.polyak)
            step = self.trainer.global_step
            every = self.hparams.curve_every
            if every and (step % every == 0 or step == self.hparams.max_steps):
                # learning curves: per-seed losses and a snapshot of the actors at this step
                self.curve.append({"step": step, **{k: float(v.detach()) / self.hparams.n_seeds
                                                    for k, v in losses.items()}})
                self.snapshots[step] = {k: v.detach().clone() for k, v in self.policies.state_dict().items()}
        E = self.hparams.n_seeds
        self.log_dict({f"loss/{k}": v.detach() / E for k, v in losses.items()}, prog_bar=False)

    def configure_optimizers(self):
        actor_params = list(self.policies.parameters())
        ids = {id(p) for p in actor_params}
        other = [p for p in self.parameters() if p.requires_grad and id(p) not in ids]
        groups = [{"params": actor_params}] + ([{"params": other}] if other else [])
        opt = torch.optim.Adam(groups, lr=self.hparams.lr)
        T = max(1, self.hparams.max_steps)
        # actor: cosine decay (as the reference's actor schedule); critics/values: constant
        lambdas = [lambda s: 0.5 * (1 + math.cos(math.pi * min(s, T) / T))] + ([lambda s: 1.0] if other else [])
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambdas)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class BC(OfflinePolicyModule):
    actors = {"bc": (False, "bc")}


class CBC(OfflinePolicyModule):
    actors = {"cbc": (True, "bc")}


class TaskIQL(OfflinePolicyModule):
    task_iql = True
    actors = {"task_iql": (False, "task")}


class SCIQL(OfflinePolicyModule):
    style_iql = True
    task_iql = True
    actors = {"sciql": (True, "style"), "gawr": (True, "gawr")}


class SCIQLSuite(OfflinePolicyModule):
    """SCIQL with the baselines' actors alongside (same batches; task-only actor shares the task IQL)."""

    style_iql = True
    task_iql = True
    actors = {"bc": (False, "bc"), "cbc": (True, "bc"), "sciql": (True, "style"), "gawr": (True, "gawr"),
              "task_iql": (False, "task")}


MODULES = {"bc": BC, "cbc": CBC, "task_iql": TaskIQL, "sciql": SCIQL, "suite": SCIQLSuite}
METHODS = ("bc", "cbc", "sciql", "gawr", "task_iql")   # actor names, in report order
