"""train: per seed, (1) masked-diffusion pretraining of the shared tiny transformer in bidirectional
mode, stopped at a fixed step count (base accuracy moderate), then (2) two GRPO arms from that base,
both through the shared trainer ``stages.common.grpo`` (group advantages, clipped surrogate, no KL):

- ``justgrpo``:  AR-order rollouts (block 1, T = 1) scored by the exact AR likelihood under the dLLM;
- ``arbitrary``: low-confidence arbitrary-order rollouts (T = 1) scored by the d1-style one-step
  masked surrogate (the baseline that keeps the dLLM's flexibility during RL).

Greedy accuracy (1 token/step, semi-AR blocks) on a fixed test subset is logged every ``eval_every``
RL steps (accuracy vs RL step). Token log-probs go through ``kernels/token_logprob``.

    python -m stages train justgrpo [--profile smoke]
"""
from __future__ import annotations

import copy
from typing import Literal

import numpy as np
import polars as pl
import torch
from pydantic import Field, field_validator, model_validator

from kernels.record import KernelRecord
from kernels.token_logprob import token_logprob
from stages.common.config import PositiveInt, StageConfig, unique_items, TransformerShape
from stages.common.device import DeviceName, pick_device
from stages.common.grpo import GRPOConfig, GRPOModule, PromptLoader
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.common.sources import SourceConfig
from stages.common.tiny_transformer import TinyTransformerConfig
from stages.common.trainer import TrainerConfig, make_trainer
from stages.justgrpo.hf_source import DLLMConfig
from stages.justgrpo.dllm import Counter, DLLMPolicy, MaskedDiffusionLM, greedy_accuracy, reward_fn
from stages.justgrpo.prepare import load_prompts
from stages.justgrpo.task import PROMPT_LEN, VOCAB_SIZE, solution, valid_orders

Arm = Literal["justgrpo", "arbitrary"]


ModelConfig = TransformerShape


class PretrainConfig(StageConfig):
    steps: PositiveInt = Field(500, le=100_000, description="masked-diffusion steps (stop where base accuracy is moderate)")
    batch: PositiveInt = Field(64, le=4096)
    lr: float = Field(3e-3, gt=0, le=1.0)
    weight_decay: float = Field(0.0, ge=0, le=10.0)


class RLConfig(StageConfig):
    steps: PositiveInt = Field(60, le=10_000, description="GRPO steps per arm and seed")
    prompts_per_step: PositiveInt = Field(8, le=1024)
    lr: float = Field(1e-3, gt=0, le=1.0)
    grpo: GRPOConfig = GRPOConfig(group_size=8, clip_eps=0.2, kl_coef=0.0, loss_norm="active_samples",
                                  ppo_epochs=1, grad_clip=1.0)
    eval_every: PositiveInt = Field(20, le=10_000)
    eval_prompts: PositiveInt = Field(100, le=500, description="test prompts for the accuracy-vs-step curve")
    eval_block: PositiveInt = Field(7, le=32, description="semi-AR block length of the greedy evaluation")
    arms: list[Arm] = Field(default_factory=lambda: ["justgrpo", "arbitrary"], min_length=1, max_length=2)

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
    torch_threads: int = Field(1, ge=1, le=64)
    device: DeviceName = "auto"
    model: ModelConfig = ModelConfig()
    pretrain: PretrainConfig = PretrainConfig()
    rl: RLConfig = RLConfig()
    trainer: TrainerConfig = TrainerConfig(enable_progress_bar=False)
    source: SourceConfig = SourceConfig()          # full: a masked-diffusion checkpoint (LLaDA), hf_source
    dllm: DLLMConfig = DLLMConfig()                # how that checkpoint is used (mask id, gen length, eval block)


class SolutionLoader:
    """``steps`` batches of [prompt, solution] rows; each row's valid order (fork) drawn at random."""

    def __init__(self, prompts: torch.Tensor, gen_len: int, batch: int, steps: int, seed: int):
        self.prompts, self.gen_len, self.batch, self.steps, self.seed = prompts, gen_len, batch, steps, seed

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        rng = np.random.default_rng(self.seed)
        rows = self.prompts.tolist()
        for _ in range(self.steps):
            out = []
            for i in rng.integers(0, len(rows), self.batch):
                p = rows[i]
                orders = valid_orders(p[1], p[3])
                out.append(p + solution(*p, orders[rng.integers(len(orders))], self.gen_len))
            yield torch.tensor(out, dtype=torch.long)


def model_config(cfg: Config, gen_len: int) -> TinyTransformerConfig:
    m = cfg.model
    return TinyTransformerConfig(vocab_size=VOCAB_SIZE, d_model=m.d_model, n_layers=m.n_layers, n_heads=m.n_heads,
                                 max_seq_len=PROMPT_LEN + gen_len, causal=False)


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
    train_p = load_prompts(ctx.input("prepare"), "train")
    test_p = load_prompts(ctx.input("prepare"), "test")[: cfg.rl.eval_prompts].to(device)
    rec = KernelRecord(device)
    counter = Counter(rec)
    mcfg = model_config(cfg, gen_len)
    tcfg = cfg.trainer.model_copy(update={"accelerator": "gpu" if device.type == "cuda" else cfg.trainer.accelerator})
    history, pre_hist = [], []
    for seed in seeds:
        # --- 1. masked-diffusion pretraining
        torch.manual_seed(seed)
        mdlm = MaskedDiffusionLM(mcfg, cfg.pretrain.lr, cfg.pretrain.weight_decay, seed, counter)
        trainer = make_trainer(tcfg, ctx.tracker, max_steps=cfg.pretrain.steps)
        trainer.fit(mdlm, SolutionLoader(train_p, gen_len, cfg.pretrain.batch, cfg.pretrain.steps, seed))
        base = mdlm.model.to(device).eval()
        torch.save(base.state_dict(), ctx.out / f"base_s{seed}.pt")
        pre_hist += [dict(h, seed=seed) for h in mdlm.history]

        # --- 2. GRPO arms from the same base
        for arm in cfg.rl.arms:
            policy = DLLMPolicy(copy.deepcopy(base), gen_len, arm, counter)

            def eval_fn(module, step, _arm=arm):
                return {"acc_tps1": greedy_accuracy(module.policy.model, test_p, gen_len, cfg.rl.eval_block, 1, counter)}

            module = GRPOModule(policy, reward_fn, cfg.rl.grpo, lr=cfg.rl.lr, seed=seed,
                                eval_fn=eval_fn, eval_every=cfg.rl.eval_every)
            trainer = make_trainer(tcfg, ctx.tracker, max_steps=cfg.rl.steps)
            trainer.fit(module, PromptLoader(train_p, cfg.rl.prompts_per_step, cfg.rl.steps, seed=seed))
            if cfg.rl.steps % cfg.rl.eval_every:                             # final point of the curve
                module.history[-1].update(eval_fn(module, cfg.rl.steps))
            torch.save(policy.model.state_dict(), ctx.out / f"{arm}_s{seed}.pt")
            history += [dict(h, arm=arm, seed=seed) for h in module.history]

    # Triton path vs torch reference on real inputs: the last base model's logits on test prompts
    with torch.no_grad():
        x = torch.cat([test_p[:32], torch.full((min(32, len(test_p)), gen_len), 16, device=device)], 1)
        logits = base(x)[:, PROMPT_LEN:]
        tgt = logits.argmax(-1)
        rec.parity("token_logprob", token_logprob, logits.contiguous(), tgt,
                   slice=f"base dLLM (seed {seeds[-1]}) logits on 32 test prompts, fully masked completion")
    rec.save(ctx.out)
    pl.DataFrame(history, infer_schema_length=None).write_csv(ctx.out / "rl_history.csv")
    pl.DataFrame(pre_hist).write_csv(ctx.out / "pretrain_history.csv")
    write_json(ctx.out / "models.json", {"seeds": seeds, "gen_len": gen_len, "arms": list(cfg.rl.arms),
                                         "model": mcfg.__dict__, "eval_block": cfg.rl.eval_block,
                                         "rl": cfg.rl.model_dump(mode="json"),
                                         "pretrain": cfg.pretrain.model_dump(mode="json")})
