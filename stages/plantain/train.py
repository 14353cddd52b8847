"""train: per seed and per trace format (think-then-answer ``tta`` / plan-first interleaved ``pf``),
(1) SFT of the shared tiny causal transformer on that format's traces (with the injected plan
errors), then (2) GRPO through the shared trainer ``stages.common.grpo`` with the PLANTAIN reward
r = r_format × (1 + w_c·r_correct + w_h·r_helpful), r_helpful from the rule-based plan judge
(``task.validate_plan``; zero for tta, which shows no intermediate answer). Token log-probs go
through ``kernels/token_logprob``.

    python -m stages train plantain [--profile smoke]
"""
from __future__ import annotations

import copy
from typing import Literal

import polars as pl
import torch
from pydantic import Field, field_validator

from kernels.record import KernelRecord
from kernels.token_logprob import token_logprob
from stages.common.config import PositiveInt, StageConfig, unique_items, TransformerShape
from stages.common.device import DeviceName, pick_device
from stages.common.grpo import GRPOConfig, GRPOModule, PromptLoader
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.common.sources import SourceConfig
from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig
from stages.common.trainer import TrainerConfig, make_trainer
from stages.plantain.model import IGNORE, Counter, SFTModule, TracePolicy, make_reward_fn, sft_tensor
from stages.plantain.prepare import MAX_TRACE, load_split
from stages.plantain.task import PROMPT_LEN, VOCAB_SIZE

Fmt = Literal["tta", "pf"]


ModelConfig = TransformerShape


class SFTConfig(StageConfig):
    steps: PositiveInt = Field(600, le=100_000)
    batch: PositiveInt = Field(32, le=4096)
    lr: float = Field(3e-3, gt=0, le=1.0)
    weight_decay: float = Field(0.0, ge=0, le=10.0)


class RewardConfig(StageConfig):
    """Weights of r = r_format × (1 + w_correct·r_correct + w_helpful·r_helpful) (paper: 1 and 1)."""
    w_correct: float = Field(1.0, ge=0, le=100.0, description="weight of r_correct (must be ≥ 0)")
    w_helpful: float = Field(1.0, ge=0, le=100.0, description="weight of r_helpful (must be ≥ 0)")


class RLConfig(StageConfig):
    steps: PositiveInt = Field(30, le=10_000, description="GRPO steps per format and seed")
    prompts_per_step: PositiveInt = Field(8, le=1024)
    lr: float = Field(3e-4, gt=0, le=1.0)
    temperature: float = Field(1.0, gt=0, le=5.0, description="rollout sampling temperature")
    grpo: GRPOConfig = GRPOConfig(group_size=8, clip_eps=0.2, kl_coef=0.0, loss_norm="tokens", ppo_epochs=1,
                                  grad_clip=1.0)
    reward: RewardConfig = RewardConfig()


class Config(StageConfig):
    torch_threads: int = Field(1, ge=1, le=64)
    device: DeviceName = "auto"
    formats: list[Fmt] = Field(default_factory=lambda: ["tta", "pf"], min_length=2, max_length=2)
    model: ModelConfig = ModelConfig()
    sft: SFTConfig = SFTConfig()
    rl: RLConfig = RLConfig()
    trainer: TrainerConfig = TrainerConfig(enable_progress_bar=False)
    source: SourceConfig = SourceConfig()          # full: the instruction LM (hf_source.train_real)
    real_max_new: PositiveInt = Field(1024, le=32_768, description="real path: max new tokens per completion")

    @field_validator("formats")
    @classmethod
    def _distinct(cls, v):
        return unique_items(v, "formats")


def model_config(cfg: Config) -> TinyTransformerConfig:
    m = cfg.model
    return TinyTransformerConfig(vocab_size=VOCAB_SIZE, d_model=m.d_model, n_layers=m.n_layers, n_heads=m.n_heads,
                                 max_seq_len=PROMPT_LEN + MAX_TRACE, causal=True)


def run(cfg: Config, ctx: StageContext) -> None:
    if cfg.source.kind != "toy":                   # full profile: SFT + GRPO on a real LM (issue 41)
        from stages.plantain.hf_source import train_real
        return train_real(cfg, ctx)
    torch.set_num_threads(cfg.torch_threads)
    device = pick_device(cfg.device)
    prep = ctx.input("prepare")
    meta = read_json(prep / "meta.json")
    seeds = meta["seeds"]
    sft = load_split(prep, "sft")
    rl_prompts = torch.tensor(load_split(prep, "rl")["prompt"].to_list(), dtype=torch.long, device=device)
    rec = KernelRecord(device)
    counter = Counter(rec)
    mcfg = model_config(cfg)
    tcfg = cfg.trainer.model_copy(update={"accelerator": "gpu" if device.type == "cuda" else cfg.trainer.accelerator})
    data = {f: sft_tensor(sft[f"trace_{f}"].to_list(), sft["prompt"].to_list(), MAX_TRACE).to(device)
            for f in cfg.formats}
    sft_hist, rl_hist = [], []
    for seed in seeds:
        for fmt in cfg.formats:
            # --- 1. SFT on this format's traces
            torch.manual_seed(seed)
            module = SFTModule(TinyTransformer(mcfg).to(device), cfg.sft.lr, cfg.sft.weight_decay, counter)
            trainer = make_trainer(tcfg, ctx.tracker, max_steps=cfg.sft.steps)
            trainer.fit(module, PromptLoader(data[fmt], cfg.sft.batch, cfg.sft.steps, seed=seed))
            base = module.model.to(device).eval()
            torch.save(base.state_dict(), ctx.out / f"{fmt}_sft_s{seed}.pt")
            sft_hist += [dict(h, fmt=fmt, seed=seed) for h in module.history]
            # --- 2. GRPO with r_format × (1 + r_correct + r_helpful)
            policy = TracePolicy(copy.deepcopy(base), MAX_TRACE, cfg.rl.temperature, counter)
            grpo = GRPOModule(policy, make_reward_fn(fmt, cfg.rl.reward.w_correct, cfg.rl.reward.w_helpful),
                              cfg.rl.grpo, lr=cfg.rl.lr, seed=seed)
            trainer = make_trainer(tcfg, ctx.tracker, max_steps=cfg.rl.steps)
            trainer.fit(grpo, PromptLoader(rl_prompts, cfg.rl.prompts_per_step, cfg.rl.steps, seed=seed))
            torch.save(policy.model.state_dict(), ctx.out / f"{fmt}_grpo_s{seed}.pt")
            rl_hist += [dict(h, fmt=fmt, seed=seed) for h in grpo.history]
    # Triton path vs torch reference on real inputs: the last SFT model on 32 SFT sequences
    with torch.no_grad():
        x = data[cfg.formats[-1]][:32]
        logits = base(x[:, 0, :-1])[:, PROMPT_LEN - 1:].contiguous()
        tgt = torch.where(x[:, 1, PROMPT_LEN:] > 0, x[:, 0, PROMPT_LEN:], torch.full_like(x[:, 0, PROMPT_LEN:], IGNORE))
        rec.parity("token_logprob", lambda l, t, backend: token_logprob(l, t, ignore_index=IGNORE, backend=backend),
                   logits, tgt, slice=f"{cfg.formats[-1]} SFT model (seed {seeds[-1]}) on 32 SFT traces, padding ignored")
    rec.save(ctx.out)
    pl.DataFrame(sft_hist).write_csv(ctx.out / "sft_history.csv")
    pl.DataFrame(rl_hist, infer_schema_length=None).write_csv(ctx.out / "rl_history.csv")
    write_json(ctx.out / "models.json", {"seeds": seeds, "formats": list(cfg.formats), "model": mcfg.__dict__,
                                         "max_trace": MAX_TRACE, "sft": cfg.sft.model_dump(mode="json"),
                                         "rl": cfg.rl.model_dump(mode="json")})
