"""train: (1) masked-diffusion pretraining of one base dLLM (the shared tiny transformer in bidirectional
mode) on an imperfect teacher's traces (``pretrain.teacher_carry_drop``: the carry left out on that share of
carry traces) for ``pretrain.steps`` steps, its lr constant and then decayed to 0 over the last
``pretrain.lr_decay_frac`` of them; every ``pretrain.eval_every`` steps the dev readings are recorded (greedy
answer and trace accuracy, AR-order T = 1 trace pass@1), and an optional stop rule ends pretraining at the first
greedy reading at or above ``pretrain.target_greedy_acc`` (null at default); then (2) per seed, from that same
base (the shared prefix is computed once), two GRPO arms through the shared trainer ``stages.common.grpo``
(group advantages, clipped surrogate, no KL) and one control:

- ``justgrpo``:  AR-order rollouts (block 1, T = 1) scored by the exact AR likelihood under the dLLM;
- ``arbitrary``: low-confidence arbitrary-order rollouts (T = 1) scored by the d1-style one-step
  masked surrogate (the baseline that keeps the dLLM's flexibility during RL);
- ``continued`` (``rl.control``): ``rl.steps`` more masked-diffusion steps on the same teacher at the RL lr — what
  the RL steps add beyond more of the base's own training.

Every ``rl.eval_every`` RL steps, on the dev slice (never the test prompts): greedy answer- and
trace-level accuracy (1 token/step, semi-AR blocks) and, on AR samples, entropy, sampled trace pass@1
and KL to the base; every step: reward mean and std. Token log-probs go through ``kernels/token_logprob``.

    python -m stages train justgrpo [--profile smoke]
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Literal

import lightning as L

import numpy as np
import polars as pl
import torch
from pydantic import Field, field_validator, model_validator

from kernels.record import KernelRecord
from kernels.token_logprob import token_logprob
from stages.common.config import PositiveInt, StageConfig, unique_items, TransformerShape
from stages.common.device import DeviceName, attention_backend, pick_device
from stages.common.grpo import GRPOConfig, GRPOModule, PromptLoader
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.common.sources import SourceConfig
from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig
from stages.common.trainer import TrainerConfig, make_trainer
from stages.justgrpo.hf_source import DLLMConfig
from stages.justgrpo.dllm import (Counter, DLLMPolicy, MaskedDiffusionLM, decode, greedy_rates, policy_drift,
                                  reward_fn)
from stages.common.jobs import payload, run_jobs
from stages.justgrpo.prepare import load_prompts
from stages.justgrpo.task import MASK, ORDERS, PROMPT_LEN, VOCAB_SIZE, operands, solution, trace_valid

Arm = Literal["justgrpo", "arbitrary"]
PRETRAIN_CURVE = ("step", "dev_greedy_acc", "dev_greedy_trace", "dev_trace_pass1")   # pretrain_curve.csv columns


ModelConfig = TransformerShape


class PretrainConfig(StageConfig):
    steps: PositiveInt = Field(4000, le=100_000, description="most masked-diffusion steps (the stop rule may end earlier)")
    batch: PositiveInt = Field(128, le=4096)
    lr: float = Field(3e-3, gt=0, le=1.0)
    weight_decay: float = Field(0.0, ge=0, le=10.0)
    seed: int = Field(0, ge=0, lt=2**32, description="seed of the one base dLLM every RL seed starts from")
    eval_every: PositiveInt = Field(250, le=100_000, description="steps between dev-slice checks of the stop rule")
    eval_prompts: PositiveInt = Field(200, le=10_000, description="dev prompts of the stop rule")
    lr_decay_frac: float = Field(0.0, ge=0, le=1, description=(
        "0: constant lr; f > 0: constant, then linear decay to 0 over the last f · steps (LLaDA's warmup-stable-decay "
        "without the warmup: the base ends settled, not at a point of an oscillation)"))
    teacher_carry_drop: float = Field(0.0, ge=0, lt=1, description=(
        "the imperfect teacher: the share of pretraining traces of carry prompts written without the carry (a "
        "systematic slip the base imitates, so a converged base is wrong on carry prompts under greedy decoding "
        "while its T = 1 samples carry at rate 1 − this: the room RL can use and more pretraining cannot)"))
    target_greedy_acc: float | None = Field(0.75, gt=0, lt=1, description=(
        "stop at the first check whose greedy answer accuracy on the dev slice (semi-AR blocks of rl.eval_block, "
        "1 token/step: the RL findings' metric) reaches this; null: always run `steps`"))

    @model_validator(mode="after")
    def _eval(self):
        if self.eval_every > self.steps:
            raise ValueError(f"pretrain.eval_every: {self.eval_every} is more than pretrain.steps ({self.steps})")
        return self


class RLConfig(StageConfig):
    steps: PositiveInt = Field(60, le=10_000, description="GRPO steps per arm and seed")
    prompts_per_step: PositiveInt = Field(8, le=1024)
    lr: float = Field(1e-3, gt=0, le=1.0)
    grpo: GRPOConfig = GRPOConfig(group_size=8, clip_eps=0.2, kl_coef=0.0, loss_norm="active_samples",
                                  ppo_epochs=1, grad_clip=1.0)
    eval_every: PositiveInt = Field(20, le=10_000)
    eval_prompts: PositiveInt = Field(200, le=10_000, description="dev prompts for the greedy accuracy-vs-step curve")
    drift_prompts: PositiveInt = Field(64, le=10_000, description="dev prompts sampled (T = 1) for entropy and KL to base")
    eval_block: PositiveInt = Field(5, le=32, description="semi-AR block length of the greedy evaluation")
    baseline_block: PositiveInt | None = Field(5, le=32, description=(
        "the arbitrary-order arm's rollout block (low-confidence order inside each block, blocks left to right, "
        "as d1 rolls out with LLaDA's semi-AR sampler); null: one block, the whole generation"))
    arms: list[Arm] = Field(default_factory=lambda: ["justgrpo", "arbitrary"], min_length=1, max_length=2)
    control: bool = Field(True, description=(
        "also continue the base's own masked-diffusion training per seed for `steps` steps at `lr` on batches of "
        "prompts_per_step × group_size teacher traces (as many sequences per step as an RL step scores): the "
        "`continued` control, which says what the RL steps add beyond more of the base's training"))

    @field_validator("arms")
    @classmethod
    def _distinct(cls, v):
        return unique_items(v, "rl.arms")

    @model_validator(mode="after")
    def _eval(self):
        if self.eval_every > self.steps:
            raise ValueError(f"rl.eval_every: {self.eval_every} is more than rl.steps ({self.steps})")
        return self


class Config(StageConfig):
    torch_threads: int = Field(1, ge=1, le=64, description="intra-op threads of the pretraining (this process)")
    workers: int = Field(1, ge=1, le=64, description=(
        "processes for the (seed, arm) RL runs, one intra-op thread each (1: in this process, same results)"))
    device: DeviceName = "auto"
    cpu_math_attention: bool = Field(True, description=(
        "on CPU, run the RL runs' attention through PyTorch's math SDPA path (on their 64-row rollouts and "
        "likelihood passes it measured 20–35% faster than the CPU flash kernel: "
        "stages.common.device.attention_backend); "
        "ignored on CUDA. Not in pretraining: there it did not shorten the stage, and its float-level change "
        "moves where the stop rule ends (reports/studies/justgrpo_base_sensitivity.md)"))
    model: ModelConfig = ModelConfig()
    pretrain: PretrainConfig = PretrainConfig()
    rl: RLConfig = RLConfig()
    trainer: TrainerConfig = TrainerConfig(enable_progress_bar=False)
    source: SourceConfig = SourceConfig()          # full: a masked-diffusion checkpoint (LLaDA), hf_source
    dllm: DLLMConfig = DLLMConfig()                # how that checkpoint is used (mask id, gen length, eval block)


class SolutionLoader:
    """``steps`` batches of [prompt, solution] rows; each row's order (the fork) drawn at random, and (the imperfect
    teacher) a carry prompt's trace written without the carry with probability ``carry_drop``."""

    def __init__(self, prompts: torch.Tensor, gen_len: int, batch: int, steps: int, seed: int, carry_drop: float = 0.0):
        self.prompts, self.gen_len, self.batch, self.steps, self.seed = prompts, gen_len, batch, steps, seed
        self.carry_drop = carry_drop

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        rng = np.random.default_rng(self.seed)
        rows, ops = self.prompts.tolist(), operands(self.prompts).tolist()
        for _ in range(self.steps):
            idx = rng.integers(0, len(rows), self.batch)
            orders = rng.integers(len(ORDERS), size=self.batch)
            drop = rng.random(self.batch) < self.carry_drop if self.carry_drop > 0 else np.zeros(self.batch, bool)
            out = [rows[i] + solution(*ops[i], ORDERS[o], self.gen_len, drop_carry=bool(x))
                   for i, o, x in zip(idx, orders, drop)]
            yield torch.tensor(out, dtype=torch.long)


class StopAtTarget(L.Callback):
    """The pretraining stop rule: every ``every`` steps, on the dev prompts, greedy decoding (semi-AR blocks of
    ``block``, 1 token/step) and one AR-order (block 1, T = 1) sample each; record greedy answer- and
    trace-level accuracy and sampled trace-level pass@1, and stop training once the greedy answer accuracy
    reaches ``target`` (None: never stop)."""

    def __init__(self, prompts: torch.Tensor, gen_len: int, block: int, every: int, target: float | None, seed: int,
                 counter: Counter):
        self.prompts, self.gen_len, self.block, self.every, self.target = prompts, gen_len, block, every, target
        self.seed, self.counter = seed, counter
        self.curve: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        step = trainer.global_step
        if step % self.every:
            return
        model = module.model
        model.eval()
        rates = greedy_rates(model, self.prompts.to(module.device), self.gen_len, self.block, self.counter)
        g = torch.Generator(device=module.device).manual_seed(self.seed + step)
        gen, _ = decode(model, self.prompts.to(module.device), self.gen_len, 1, 1, 1.0, g, self.counter)
        model.train()
        acc = rates["answer"]
        self.curve.append({"step": step, "dev_greedy_acc": acc, "dev_greedy_trace": rates["trace"],
                           "dev_trace_pass1": float(trace_valid(gen, self.prompts.to(module.device)).float().mean())})
        if self.target is not None and acc >= self.target:
            trainer.should_stop = True


class RewardLog:
    """The reward function, recording each RL step's reward mean and std (the trainer logs only the mean)."""

    def __init__(self):
        self.rows: list[dict[str, float]] = []

    def __call__(self, prompts, roll):
        r = reward_fn(prompts, roll)
        self.rows.append({"reward_mean": float(r.mean()), "reward_std": float(r.std())})
        return r


def model_config(cfg: Config, gen_len: int) -> TinyTransformerConfig:
    m = cfg.model
    return TinyTransformerConfig(vocab_size=VOCAB_SIZE, d_model=m.d_model, n_layers=m.n_layers, n_heads=m.n_heads,
                                 max_seq_len=PROMPT_LEN + gen_len, causal=False)


def decay_window(steps: int, frac: float) -> tuple[int, int] | None:
    """(first decaying step, decay length) of the pretraining lr, or None for a constant lr."""
    n = round(steps * frac)
    return (steps - n, n) if n > 0 else None


def pretrain(cfg: Config, tcfg: TrainerConfig, ctx: StageContext, mcfg, train_p, dev_p, gen_len, counter, device):
    """One base dLLM with the stop rule; returns (model, loss history, stop-rule curve, steps run)."""
    pc = cfg.pretrain
    torch.manual_seed(pc.seed)
    mdlm = MaskedDiffusionLM(mcfg, pc.lr, pc.weight_decay, pc.seed, counter,
                             decay=decay_window(pc.steps, pc.lr_decay_frac))
    stop = StopAtTarget(dev_p[: pc.eval_prompts], gen_len, cfg.rl.eval_block, pc.eval_every, pc.target_greedy_acc,
                        pc.seed, counter)
    trainer = make_trainer(tcfg, ctx.tracker, max_steps=pc.steps, callbacks=[stop])
    trainer.fit(mdlm, SolutionLoader(train_p, gen_len, pc.batch, pc.steps, pc.seed, pc.teacher_carry_drop))
    return mdlm.model.to(device).eval(), mdlm.history, stop.curve, int(trainer.global_step)


def control_run(seed: int, p: dict) -> dict:
    """The `continued` control of one seed: the base trained on for ``rl.steps`` more masked-diffusion steps (same
    objective and teacher as pretraining, lr ``rl.lr``, ``prompts_per_step × group_size`` traces per step, batches
    and masks seeded by this seed); dev greedy accuracy at step 0 and at the end. Saves ``continued_s<seed>.pt``."""
    cfg, tcfg = Config.model_validate(p["cfg"]), TrainerConfig.model_validate(p["trainer"])
    device, gen_len = torch.device(p["device"]), p["gen_len"]
    rec = KernelRecord(device)
    counter = Counter(rec)
    mdlm = MaskedDiffusionLM(TinyTransformerConfig(**p["model"]), cfg.rl.lr, cfg.pretrain.weight_decay,
                             10_000 + seed, counter)
    mdlm.model.load_state_dict(p["base"])
    mdlm.to(device)
    acc_dev = p["acc_dev"].to(device)

    def point(step: int) -> dict:
        rates = greedy_rates(mdlm.model.eval(), acc_dev, gen_len, cfg.rl.eval_block, counter)
        mdlm.model.train()
        return {"step": step, "dev_acc": rates["answer"], "dev_trace_acc": rates["trace"]}

    rows = [point(0)]
    batch = cfg.rl.prompts_per_step * cfg.rl.grpo.group_size
    trainer = make_trainer(tcfg, None, max_steps=cfg.rl.steps)
    trainer.fit(mdlm, SolutionLoader(p["train_p"], gen_len, batch, cfg.rl.steps, 10_000 + seed,
                                     cfg.pretrain.teacher_carry_drop))
    rows.append(point(cfg.rl.steps))
    torch.save(mdlm.model.state_dict(), Path(p["out"]) / f"continued_s{seed}.pt")
    return {"seed": seed, "arm": "continued", "history": [dict(r, arm="continued", seed=seed) for r in rows],
            "calls": rec.to_dict().get("token_logprob", {}).get("calls", 0)}


def rl_run(job: tuple[int, str]) -> dict:
    """One GRPO arm of one seed from the shared base (a job of ``jobs.run_jobs``: inputs from its payload).
    Saves ``<arm>_s<seed>.pt``; returns its history rows (one per RL step, dev metrics every ``rl.eval_every``)
    and its token_logprob call count."""
    seed, arm = job
    p = payload()
    if arm == "continued":
        return control_run(seed, p)
    cfg, tcfg = Config.model_validate(p["cfg"]), TrainerConfig.model_validate(p["trainer"])
    device, gen_len = torch.device(p["device"]), p["gen_len"]
    rec = KernelRecord(device)
    counter = Counter(rec)
    base = TinyTransformer(TinyTransformerConfig(**p["model"])).to(device)
    base.load_state_dict(p["base"])
    base.eval()
    for q in base.parameters():
        q.requires_grad_(False)
    acc_dev, drift_dev = p["acc_dev"].to(device), p["drift_dev"].to(device)
    policy = DLLMPolicy(copy.deepcopy(base).train(), gen_len, arm, counter, cfg.rl.baseline_block,
                        score_active_only=cfg.rl.grpo.kl_coef == 0)   # exact without a KL term (the paper's β = 0)
    for q in policy.parameters():
        q.requires_grad_(True)

    def eval_fn(module, step):
        model = module.policy.model
        rates = greedy_rates(model, acc_dev, gen_len, cfg.rl.eval_block, counter)
        g = torch.Generator(device=device).manual_seed(10_000 * seed + step)
        return {"dev_acc": rates["answer"], "dev_trace_acc": rates["trace"],
                **policy_drift(model, base, drift_dev, gen_len, g, counter)}

    rewards = RewardLog()
    module = GRPOModule(policy, rewards, cfg.rl.grpo, lr=cfg.rl.lr, seed=seed, eval_fn=eval_fn,
                        eval_every=cfg.rl.eval_every)
    trainer = make_trainer(tcfg, None, max_steps=cfg.rl.steps)         # W&B: the parent logs the rows
    with attention_backend(device, cfg.cpu_math_attention):
        trainer.fit(module, PromptLoader(p["train_p"], cfg.rl.prompts_per_step, cfg.rl.steps, seed=seed))
    if cfg.rl.steps % cfg.rl.eval_every:                                 # final point of the curve
        module.history[-1].update(eval_fn(module, cfg.rl.steps))
    torch.save(policy.model.state_dict(), Path(p["out"]) / f"{arm}_s{seed}.pt")
    steps_rows = [h for h in module.history if h["step"] > 0]
    for h, r in zip(steps_rows, rewards.rows):
        h.update(r)                                                      # the sampled rewards' std beside the mean
    # the surrogate's value ("loss", ≈ 0 by construction with ratio ≡ 1) tells a reader nothing: not kept
    rows = [dict({k: v for k, v in h.items() if k != "loss"}, arm=arm, seed=seed) for h in module.history]
    return {"seed": seed, "arm": arm, "history": rows,
            "calls": rec.to_dict().get("token_logprob", {}).get("calls", 0)}


def run(cfg: Config, ctx: StageContext) -> None:
    if cfg.source.kind != "toy":                   # full profile: GRPO on the real dLLM checkpoint (issue 41)
        from stages.justgrpo.hf_source import train_real
        return train_real(cfg, ctx)
    torch.set_num_threads(cfg.torch_threads)
    device = pick_device(cfg.device)
    meta = read_json(ctx.input("prepare") / "meta.json")
    gen_len, seeds = meta["gen_len"], meta["seeds"]
    if cfg.rl.eval_block > gen_len:
        raise ValueError(f"rl.eval_block: {cfg.rl.eval_block} exceeds gen_len {gen_len}")
    if cfg.rl.baseline_block is not None and cfg.rl.baseline_block > gen_len:
        raise ValueError(f"rl.baseline_block: {cfg.rl.baseline_block} exceeds gen_len {gen_len}")
    train_p = load_prompts(ctx.input("prepare"), "train")
    dev_p = load_prompts(ctx.input("prepare"), "dev").to(device)
    for name, n in (("pretrain.eval_prompts", cfg.pretrain.eval_prompts), ("rl.eval_prompts", cfg.rl.eval_prompts),
                    ("rl.drift_prompts", cfg.rl.drift_prompts)):
        if n > len(dev_p):
            raise ValueError(f"{name}: {n} is more than the {len(dev_p)} dev prompts (prepare.dev_frac)")
    rec = KernelRecord(device)
    counter = Counter(rec)
    mcfg = model_config(cfg, gen_len)
    tcfg = cfg.trainer.model_copy(update={"accelerator": "gpu" if device.type == "cuda" else cfg.trainer.accelerator})

    # --- 1. one masked-diffusion pretraining, shared by every seed and arm
    base, pre_hist, pre_curve, pre_steps = pretrain(cfg, tcfg, ctx, mcfg, train_p, dev_p, gen_len, counter, device)
    torch.save(base.state_dict(), ctx.out / "base.pt")
    for p in base.parameters():
        p.requires_grad_(False)

    # --- 2. per seed, GRPO arms from that base: independent runs, in a pool of single-threaded processes
    controls = ["continued"] if cfg.rl.control else []
    jobs = ([(seed, arm) for arm in sorted(cfg.rl.arms, key=lambda a: a != "justgrpo") for seed in seeds]
            + [(seed, c) for c in controls for seed in seeds])
    data = {"cfg": cfg.model_dump(mode="json"), "trainer": tcfg.model_dump(mode="json"), "model": mcfg.__dict__,
            "base": {k: v.cpu() for k, v in base.state_dict().items()}, "device": str(device), "gen_len": gen_len,
            "train_p": train_p, "acc_dev": dev_p[: cfg.rl.eval_prompts].cpu(),
            "drift_dev": dev_p[: cfg.rl.drift_prompts].cpu(), "out": str(ctx.out)}
    done = {(r["seed"], r["arm"]): r for r in run_jobs(rl_run, jobs, data, cfg.workers)}
    history = []
    for seed in seeds:                                                   # rows in (seed, arm) order, as before
        for arm in list(cfg.rl.arms) + controls:
            r = done[(seed, arm)]
            rec.count("token_logprob", r["calls"])
            history += r["history"]
            for h in r["history"] if ctx.tracker is not None else ():  # W&B: one curve per arm and seed
                ctx.tracker.log({"rl/step": h["step"], **{f"rl/{arm}/seed{seed}/{k}": v for k, v in h.items()
                                                           if k not in ("step", "arm", "seed")}})

    # Triton path vs torch reference on real inputs: the base model's logits on dev prompts
    with torch.no_grad():
        x = torch.cat([dev_p[:32], torch.full((min(32, len(dev_p)), gen_len), MASK, device=device)], 1)
        logits = base(x)[:, PROMPT_LEN:]
        tgt = logits.argmax(-1)
        rec.parity("token_logprob", token_logprob, logits.contiguous(), tgt,
                   slice="base dLLM logits on 32 dev prompts, fully masked completion")
    rec.save(ctx.out)
    frame = pl.DataFrame(history, infer_schema_length=None)
    frame.write_csv(ctx.out / "rl_history.csv")
    if ctx.tracker is not None:
        ctx.tracker.log_table("rl_history", frame)
    pl.DataFrame(pre_hist).write_csv(ctx.out / "pretrain_history.csv")
    pl.DataFrame(pre_curve, schema={"step": pl.Int64, **{c: pl.Float64 for c in PRETRAIN_CURVE[1:]}}).write_csv(
        ctx.out / "pretrain_curve.csv")
    write_json(ctx.out / "models.json", {"seeds": seeds, "gen_len": gen_len, "arms": list(cfg.rl.arms),
                                         "controls": controls,
                                         "model": mcfg.__dict__, "eval_block": cfg.rl.eval_block,
                                         "rl": cfg.rl.model_dump(mode="json"),
                                         "pretrain": cfg.pretrain.model_dump(mode="json"),
                                         "pretrain_steps_run": pre_steps,
                                         "pretrain_stopped_at_target": bool(
                                             pre_curve and cfg.pretrain.target_greedy_acc is not None
                                             and pre_curve[-1]["dev_greedy_acc"] >= cfg.pretrain.target_greedy_acc)})
