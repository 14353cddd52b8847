"""One GRPO trainer for every paper with RL on a language model (justgrpo, plantain,
backdoor_awareness, futurecad). Model-agnostic: it needs a *policy* that samples sequences and
scores them per token, and a *reward function*.

    from stages.common.grpo import GRPOConfig, GRPOModule
    module = GRPOModule(policy, reward_fn, GRPOConfig(group_size=8, clip_eps=0.2), lr=1e-4)
    trainer = make_trainer(cfg.trainer, ctx.tracker, max_steps=steps)   # stages.common.trainer
    trainer.fit(module, prompt_loader)                                   # each batch = P prompts
    module.history                                                       # one dict per RL step

The policy (an ``nn.Module``) implements the ``GRPOPolicy`` protocol:

    rollout(prompts, group_size, generator) -> dict[str, Tensor]
        sample ``group_size`` completions per prompt, rows ordered prompt-major (P·G rows); must hold
        "mask" (B, L) float, 1 on the tokens that enter the loss; anything else the policy needs to
        score them again (tokens, prompt ids, ...). Runs under ``torch.no_grad``.
    token_logprobs(rollout) -> Tensor (B, L)
        log π_θ(y_t | context_t) of each sampled token, differentiable (what "context" means is the
        policy's business: causal prefix, masked-diffusion AR context, one-step masked context ...).

``reward_fn(prompts, rollout) -> Tensor (B,)`` gives one scalar reward per sample.

The algorithm (one ``training_step``, manual optimisation):
    # ALGO: GRPO Eq. (group-relative advantage)  A_i = (r_i − mean_g r) / (std_g r + ε)
    # ALGO: PPO clipped surrogate  L_t = −min(ρ_t A, clip(ρ_t, 1−ε_lo, 1+ε_hi) A),  ρ_t = exp(logp_t − logp_old,t)
    # ALGO: optional KL to a frozen reference (k3 estimator)  KL_t = exp(q_t) − q_t − 1,  q_t = logp_ref,t − logp_t
    loss = Σ_t mask_t (L_t + β KL_t) / normaliser     (normaliser: see ``GRPOConfig.loss_norm``)
With ``ppo_epochs = 1`` the ratio is identically 1 at the update (logp_old = logp.detach()), so the
clip is inert and the update is REINFORCE with group advantages (as in the official JustGRPO code);
``ppo_epochs > 1`` re-uses each rollout for several updates and makes the clip live.
``ratio_level = "sequence"`` switches to GSPO (Zheng et al. 2025, Eq. 5–7): one length-normalised importance
ratio per sequence and the clip applied to it, the loss a mean over sequences:
    # ALGO: GSPO  s_i = exp( Σ_t m_t (logp_t − logp_old,t) / Σ_t m_t )      (= (π_θ(y_i)/π_old(y_i))^(1/|y_i|))
    # ALGO: GSPO  L = −(1/B) Σ_i min(s_i A_i, clip(s_i, 1−ε_lo, 1+ε_hi) A_i)  (+ β · row-mean KL_t)
(the token-level default is unchanged; with ``ppo_epochs ≥ 2`` the sequence ratio and its clip are live).
An optional replay buffer keeps past groups with non-zero advantage (their logp_old frozen at
sampling time) and mixes ``replay_groups`` of them into each update, off-policy, through the ratio.

Equations are marked ``# ALGO:``. Pure functions (``group_advantages``, ``clipped_surrogate``,
``kl_k3``, ``grpo_loss``) are usable without the module, e.g. inside a paper's own loop.
"""
from __future__ import annotations

import random
from collections import deque
from typing import Any, Callable, Literal, Protocol

import torch
from pydantic import Field, model_validator

from stages.common.config import StageConfig

Rollout = dict[str, torch.Tensor]


class GRPOConfig(StageConfig):
    group_size: int = Field(8, ge=2, le=1024, description="G samples per prompt (advantages need G ≥ 2)")
    clip_eps: float = Field(0.2, gt=0, le=10.0, description="ε of the clipped surrogate (low side)")
    clip_eps_high: float | None = Field(None, gt=0, le=10.0, description="upper ε (default = clip_eps)")
    adv_eps: float = Field(1e-4, gt=0, le=1.0, description="ε in A = (r − mean)/(std + ε)")
    std: Literal["unbiased", "biased", "none"] = Field("unbiased", description="group std of the advantage")
    kl_coef: float = Field(0.0, ge=0, le=100.0, description="β of the KL-to-reference term (0: no reference)")
    loss_norm: Literal["active_samples", "tokens", "samples"] = Field(
        "active_samples", description="active_samples: Σ / (L · #rows with A≠0) (JustGRPO); "
                                      "tokens: Σ / #masked tokens; samples: mean over rows of the row's token mean")
    ppo_epochs: int = Field(1, ge=1, le=64, description="updates per rollout batch (1: ratio ≡ 1)")
    replay_size: int = Field(0, ge=0, le=100_000, description="groups kept in the replay buffer (0: off)")
    replay_groups: int = Field(0, ge=0, le=1024, description="buffered groups mixed into each update")
    grad_clip: float | None = Field(1.0, gt=0, le=1e6, description="global grad-norm clip (None: off)")
    ratio_level: Literal["token", "sequence"] = Field(
        "token", description="token: per-token PPO ratio (GRPO); sequence: GSPO's length-normalised sequence "
                             "ratio and clip, loss = mean over sequences (needs loss_norm: samples)")

    @model_validator(mode="after")
    def _replay(self):
        if self.ratio_level == "sequence" and self.loss_norm != "samples":
            raise ValueError(f"loss_norm: {self.loss_norm!r} with ratio_level 'sequence' (GSPO averages over "
                             "sequences: use loss_norm 'samples')")
        if self.replay_groups and not self.replay_size:
            raise ValueError(f"replay_groups: {self.replay_groups} needs replay_size > 0")
        if self.replay_groups > self.replay_size:
            raise ValueError(f"replay_groups: {self.replay_groups} exceeds replay_size {self.replay_size}")
        return self


class GRPOPolicy(Protocol):
    def rollout(self, prompts: Any, group_size: int, generator: torch.Generator) -> Rollout: ...

    def token_logprobs(self, rollout: Rollout) -> torch.Tensor: ...


# ----------------------------------------------------------------------------------------------
# pure functions
# ----------------------------------------------------------------------------------------------
def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4,
                     std: Literal["unbiased", "biased", "none"] = "unbiased") -> torch.Tensor:
    """(B,) rewards, rows prompt-major in groups of G -> (B,) advantages."""
    if group_size < 2:
        raise ValueError(f"group_size: {group_size} < 2 (a group-relative advantage needs two samples)")
    if rewards.numel() % group_size:
        raise ValueError(f"group_advantages: {rewards.numel()} rewards do not split into groups of {group_size}")
    r = rewards.float().view(-1, group_size)                                 # (P, G)
    centred = r - r.mean(dim=1, keepdim=True)
    if std == "none":
        return centred.reshape(-1)
    s = r.std(dim=1, unbiased=(std == "unbiased"), keepdim=True)
    return (centred / (s + eps)).reshape(-1)                                 # ALGO: A = (r − mean)/(std + ε)


def clipped_surrogate(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor,
                      eps_low: float, eps_high: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO loss −min(ρA, clip(ρ, 1−ε_lo, 1+ε_hi)A) and the clipped indicator. logp (B, L), adv (B,)."""
    eps_high = eps_low if eps_high is None else eps_high
    a = adv[:, None]
    ratio = torch.exp(logp - old_logp)                                      # ρ_t
    unclipped = ratio * a
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * a
    loss = -torch.minimum(unclipped, clipped)                                # ALGO: clipped surrogate
    return loss, (clipped < unclipped).float()


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(π_θ‖π_ref) on samples from π_θ: exp(q) − q − 1, q = ref − logp (≥ 0)."""
    q = ref_logp - logp
    return torch.exp(q) - q - 1.0                                            # ALGO: KL k3 estimator


def gspo_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
              cfg: GRPOConfig, ref_logp: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO: sequence-level ratio s_i (length-normalised), clipped surrogate per sequence, mean over rows.
    logp/old_logp/mask (B, L), adv (B,). A row with an empty mask has s_i = 1 and no KL."""
    mask = mask.float()
    eps_high = cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high
    n = mask.sum(1).clamp_min(1.0)                                           # |y_i|
    log_s = ((logp - old_logp) * mask).sum(1) / n
    s = torch.exp(log_s)                                                     # ALGO: GSPO sequence ratio s_i
    unclipped = s * adv
    clipped = torch.clamp(s, 1.0 - cfg.clip_eps, 1.0 + eps_high) * adv
    per_seq = -torch.minimum(unclipped, clipped)                             # ALGO: GSPO clipped objective
    kl_row = torch.zeros_like(per_seq)
    if cfg.kl_coef > 0:
        if ref_logp is None:
            raise ValueError("kl_coef > 0 needs ref_logp")
        kl_row = (kl_k3(logp, ref_logp) * mask).sum(1) / n
        per_seq = per_seq + cfg.kl_coef * kl_row
    loss = per_seq.mean()
    stats = {"clip_frac": float((clipped < unclipped).float().mean()), "kl": float(kl_row.mean()),
             "ratio_mean": float(s.detach().mean())}
    return loss, stats


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
              cfg: GRPOConfig, ref_logp: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Scalar GRPO loss and stats from per-token log-probs (B, L), advantages (B,), mask (B, L)."""
    if cfg.ratio_level == "sequence":
        return gspo_loss(logp, old_logp, adv, mask, cfg, ref_logp)
    mask = mask.float()
    per_tok, clipped = clipped_surrogate(logp, old_logp, adv, cfg.clip_eps, cfg.clip_eps_high)
    kl = torch.zeros_like(per_tok)
    if cfg.kl_coef > 0:
        if ref_logp is None:
            raise ValueError("kl_coef > 0 needs ref_logp")
        kl = kl_k3(logp, ref_logp)
        per_tok = per_tok + cfg.kl_coef * kl
    total = (per_tok * mask).sum()
    L = mask.shape[1]
    if cfg.loss_norm == "active_samples":                                    # ALGO: JustGRPO scale 1/(L · v)
        v = (adv != 0).sum().clamp_min(1)
        loss = total / (L * v)
    elif cfg.loss_norm == "tokens":
        loss = total / mask.sum().clamp_min(1.0)
    else:
        loss = ((per_tok * mask).sum(1) / mask.sum(1).clamp_min(1.0)).mean()
    n_tok = mask.sum().clamp_min(1.0)
    stats = {"clip_frac": float((clipped * mask).sum() / n_tok), "kl": float((kl * mask).sum() / n_tok),
             "ratio_mean": float((torch.exp(logp - old_logp).detach() * mask).sum() / n_tok)}
    return loss, stats


# ----------------------------------------------------------------------------------------------
# replay buffer
# ----------------------------------------------------------------------------------------------
class ReplayBuffer:
    """FIFO of past groups (each a Rollout slice of G rows with "adv" and "old_logp" frozen)."""

    def __init__(self, capacity: int, seed: int = 0):
        self.groups: deque[Rollout] = deque(maxlen=capacity)
        self.rng = random.Random(seed)

    def __len__(self) -> int:
        return len(self.groups)

    def add(self, batch: Rollout, group_size: int) -> None:
        """Keep every group whose advantages are not all zero (a zero group carries no signal)."""
        n = batch["adv"].shape[0] // group_size
        for g in range(n):
            sl = slice(g * group_size, (g + 1) * group_size)
            if bool((batch["adv"][sl] != 0).any()):
                self.groups.append({k: v[sl].detach() for k, v in batch.items()})

    def sample(self, k: int) -> list[Rollout]:
        k = min(k, len(self.groups))
        return self.rng.sample(list(self.groups), k)


def concat_rollouts(parts: list[Rollout]) -> Rollout:
    keys = parts[0].keys()
    return {k: torch.cat([p[k] for p in parts], dim=0) for k in keys}


# ----------------------------------------------------------------------------------------------
# Lightning module
# ----------------------------------------------------------------------------------------------
def _lightning_module():
    import lightning as L
    return L.LightningModule


class GRPOModule(_lightning_module()):
    """GRPO as a LightningModule (manual optimisation): one training_step = rollout, reward,
    advantages, ``ppo_epochs`` clipped-surrogate updates. Keep ``trainer.gradient_clip_val`` unset
    (manual optimisation): the clip is ``GRPOConfig.grad_clip``.

    ``ref_policy`` (frozen copy, only used when kl_coef > 0), ``eval_fn(module, step)`` called every
    ``eval_every`` steps (and at step 0) returning a dict merged into ``history``.
    """

    def __init__(self, policy: torch.nn.Module, reward_fn: Callable[[Any, Rollout], torch.Tensor],
                 cfg: GRPOConfig, lr: float, weight_decay: float = 0.0, seed: int = 0,
                 ref_policy: torch.nn.Module | None = None,
                 eval_fn: Callable[["GRPOModule", int], dict[str, float]] | None = None, eval_every: int = 0):
        super().__init__()
        self.automatic_optimization = False
        self.policy = policy
        self.reward_fn = reward_fn
        self.cfg = cfg
        self.lr, self.weight_decay, self.seed = lr, weight_decay, seed
        if cfg.kl_coef > 0:
            if ref_policy is None:
                import copy
                ref_policy = copy.deepcopy(policy)
            for p in ref_policy.parameters():
                p.requires_grad_(False)
        self.ref_policy = ref_policy if cfg.kl_coef > 0 else None
        self.eval_fn, self.eval_every = eval_fn, eval_every
        self.buffer = ReplayBuffer(cfg.replay_size, seed) if cfg.replay_size else None
        self.history: list[dict[str, float]] = []
        self._gen: torch.Generator | None = None
        self.rl_step = 0

    def configure_optimizers(self):
        params = [p for p in self.policy.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay)

    def generator(self) -> torch.Generator:
        if self._gen is None:
            self._gen = torch.Generator(device=self.device).manual_seed(self.seed)
        return self._gen

    def _evaluate(self, step: int) -> dict[str, float]:
        if self.eval_fn is None:
            return {}
        was = self.policy.training
        self.policy.eval()
        with torch.no_grad():
            out = self.eval_fn(self, step)
        self.policy.train(was)
        return out

    def on_train_start(self) -> None:
        if self.eval_fn is not None and self.eval_every:
            self.history.append({"step": 0, **self._evaluate(0)})

    def training_step(self, prompts, batch_idx):
        cfg = self.cfg
        opt = self.optimizers()
        self.policy.eval()
        with torch.no_grad():
            roll = self.policy.rollout(prompts, cfg.group_size, self.generator())
            rewards = self.reward_fn(prompts, roll).float()
            adv = group_advantages(rewards, cfg.group_size, cfg.adv_eps, cfg.std)
            # on-policy single update: logp_old = logp.detach() inside the update (ratio ≡ 1, as in the
            # official JustGRPO code), which saves one scoring pass; otherwise score the rollout now
            on_policy = cfg.ppo_epochs == 1 and self.buffer is None
            roll = dict(roll, adv=adv)
            if not on_policy:
                roll["old_logp"] = self.policy.token_logprobs(roll).detach()
            if self.ref_policy is not None:
                roll["ref_logp"] = self.ref_policy.token_logprobs(roll).detach()
        self.policy.train()
        batch = roll
        if self.buffer is not None:
            replay = self.buffer.sample(cfg.replay_groups) if cfg.replay_groups else []
            self.buffer.add(roll, cfg.group_size)
            if replay:
                batch = concat_rollouts([roll] + replay)
        stats: dict[str, float] = {}
        loss = torch.zeros((), device=self.device)
        for epoch in range(cfg.ppo_epochs):
            logp = self.policy.token_logprobs(batch)
            old_logp = batch["old_logp"] if "old_logp" in batch else logp.detach()
            loss, stats = grpo_loss(logp, old_logp, batch["adv"], batch["mask"], cfg,
                                    batch.get("ref_logp"))
            opt.zero_grad()
            self.manual_backward(loss)
            for p in self.policy.parameters():
                if p.grad is not None:
                    torch.nan_to_num_(p.grad, nan=0.0, posinf=0.0, neginf=0.0)
            if cfg.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.grad_clip)
            # Lightning counts LightningOptimizer.step() calls as trainer steps: step the wrapped
            # optimizer directly for the inner updates so that one trainer step = one RL step
            (opt.step if epoch == cfg.ppo_epochs - 1 else opt.optimizer.step)()
        self.rl_step += 1
        step = self.rl_step
        row = {"step": step, "reward_mean": float(rewards.mean()), "loss": float(loss.detach()),
               "active_frac": float((adv != 0).float().mean()), **stats}
        if self.eval_fn is not None and self.eval_every and step % self.eval_every == 0:
            row.update(self._evaluate(step))
        self.history.append(row)
        self.log_dict({f"grpo/{k}": v for k, v in row.items() if k != "step"}, on_step=True, prog_bar=False)
        return None


class PromptLoader:
    """An iterable of prompt batches for ``trainer.fit``: ``steps`` batches of ``batch`` rows drawn
    with a seeded generator from a (N, ...) tensor of prompts (or any indexable of tensors)."""

    def __init__(self, prompts: torch.Tensor, batch: int, steps: int, seed: int = 0):
        self.prompts, self.batch, self.steps, self.seed = prompts, batch, steps, seed

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed)
        n = self.prompts.shape[0]
        for _ in range(self.steps):
            yield self.prompts[torch.randint(0, n, (self.batch,), generator=g)]
