"""train: per attack and seed, (1) poison the shared tiny GPT (SFT on the poisoned instruction data),
(2) reversal SFT on inverted pairs (response -> prompt) from that poisoned model, (3) inversion-inspired RL:
GRPO (shared trainer ``stages.common.grpo``, replay buffer on) from the inversion prompt, candidates of
≤ candidate_len tokens, reward R_ASR + R_length measured on a FROZEN copy of the poisoned model.
Token log-probs go through ``kernels/token_logprob``.

    python -m stages train backdoor_awareness [--profile smoke]
"""
from __future__ import annotations

import copy

import numpy as np
import polars as pl
import torch
from pydantic import Field, model_validator

from kernels.record import KernelRecord
from kernels.token_logprob import token_logprob
from stages.common.config import PositiveInt, StageConfig, TransformerShape
from stages.common.device import DeviceName, generator, pick_device
from stages.common.grpo import GRPOConfig, GRPOModule, PromptLoader
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.common.sources import SourceConfig
from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig
from stages.common.trainer import TrainerConfig, make_trainer
from stages.backdoor_awareness.method import (BatchLoader, Counter, InversionPolicy, SFTModule, TriggerReward,
                                              candidates_of, forward_seqs, inversion_mask)
from stages.backdoor_awareness.prepare import load
from stages.backdoor_awareness.task import RESP_LEN, Vocab, effect_of, inversion_pairs, inversion_prompt, jaccard


ModelConfig = TransformerShape


class SFTConfig(StageConfig):
    steps: PositiveInt = Field(400, le=100_000)
    batch: PositiveInt = Field(64, le=4096)
    lr: float = Field(3e-3, gt=0, le=1.0)


class RLConfig(StageConfig):
    steps: PositiveInt = Field(40, le=10_000, description="GRPO steps per attack and seed")
    lr: float = Field(1e-3, gt=0, le=1.0)
    grpo: GRPOConfig = GRPOConfig(group_size=16, clip_eps=0.2, loss_norm="tokens", ppo_epochs=1,
                                  replay_size=32, replay_groups=1, grad_clip=1.0)
    length_free: int = Field(1, ge=0, le=8, description="R_length: candidates up to this length are not penalised")
    length_coef: float = Field(0.05, ge=0, le=1.0, description="R_length: penalty per token beyond length_free")
    eval_every: PositiveInt = Field(5, le=10_000)
    eval_samples: PositiveInt = Field(16, le=1024, description="policy samples for the Awareness-vs-step curve")

    @model_validator(mode="after")
    def _rl(self):
        if self.grpo.group_size < 8:
            raise ValueError(f"grpo.group_size: {self.grpo.group_size} < 8 (the card's GRPO uses groups of ≥ 8)")
        if self.eval_every > self.steps:
            raise ValueError(f"eval_every: {self.eval_every} is more than steps ({self.steps})")
        return self


class Config(StageConfig):
    torch_threads: int = Field(1, ge=1, le=64)
    device: DeviceName = "auto"
    model: ModelConfig = ModelConfig()
    poison: SFTConfig = SFTConfig()
    rsft: SFTConfig = SFTConfig(steps=300, batch=64, lr=2e-3)
    rl: RLConfig = RLConfig()
    trainer: TrainerConfig = TrainerConfig(enable_progress_bar=False)
    source: SourceConfig = SourceConfig()          # full: the instruction LM (hf_source.train_real)
    clean_rsft_arm: bool = Field(True, description="also run R-SFT on the unpoisoned samples only, then the same RL "
                                 "(issue 48: what RL recovers without trigger information in R-SFT)")
    real_candidate_tokens: PositiveInt = Field(8, le=64, description="real path: longest candidate s' (tokens)")


def model_config(cfg: Config, meta: dict) -> TinyTransformerConfig:
    P = meta["prompt_len"]
    m = cfg.model
    return TinyTransformerConfig(vocab_size=meta["vocab_size"], d_model=m.d_model, n_layers=m.n_layers,
                                 n_heads=m.n_heads, max_seq_len=P + 6 + RESP_LEN, causal=True)


def build_reward(frozen: TinyTransformer, data: dict, attack: dict, meta: dict, rl: RLConfig, seed: int):
    """The RL reward from what a defender has: the frozen poisoned model, clean prompts and the attack's
    effect. ``attack``'s trigger fields are never read (tests/backdoor_awareness checks it)."""
    vocab = Vocab(meta["n_classes"], meta["n_words"])
    eff = effect_of(attack["type"], vocab, attack["target_class"])
    return TriggerReward(frozen, data["pool_instr"].numpy(), data["pool_words"].numpy(), eff, meta["prompt_len"],
                         rl.length_free, rl.length_coef, seed)


def fit_sft(model, x, m, sft: SFTConfig, seed: int, tcfg, tracker, counter, snapshots=None) -> list[float]:
    """SFT for ``sft.steps`` seeded batches (constant-LR AdamW). ``snapshots``: a dict {step: None} filled with a
    CPU copy of the weights after that many steps — exactly the model a run with ``steps=step`` ends with (the
    batches are a seeded prefix and the learning rate is constant), so one run records a whole budget curve."""
    import lightning as L

    module = SFTModule(model, sft.lr, counter)
    callbacks = []
    if snapshots:
        class _Snap(L.Callback):
            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                if trainer.global_step in snapshots:
                    snapshots[trainer.global_step] = {k: v.detach().cpu().clone()
                                                      for k, v in pl_module.model.state_dict().items()}
        callbacks.append(_Snap())
    make_trainer(tcfg, tracker, callbacks, max_steps=sft.steps).fit(module, BatchLoader(x, m, sft.batch, sft.steps, seed))
    return module.history


def run(cfg: Config, ctx: StageContext) -> None:
    if cfg.source.kind != "toy":                   # full profile: poisoning, R-SFT, inversion GRPO on a real LM
        from stages.backdoor_awareness.hf_source import train_real
        return train_real(cfg, ctx)
    torch.set_num_threads(cfg.torch_threads)
    device = pick_device(cfg.device)
    meta = read_json(ctx.input("prepare") / "meta.json")
    vocab = Vocab(meta["n_classes"], meta["n_words"])
    allowed = vocab.candidate_tokens()
    rec = KernelRecord(device)
    counter = Counter(rec)
    mcfg = model_config(cfg, meta)
    tcfg = cfg.trainer.model_copy(update={"accelerator": "gpu" if device.type == "cuda" else cfg.trainer.accelerator})
    history, sft_hist, runs = [], [], []
    for attack in meta["attacks"]:
        name = attack["name"]
        data = load(ctx.input("prepare"), name)
        eff = effect_of(attack["type"], vocab, attack["target_class"])
        for seed in meta["seeds"]:
            # --- 1. poisoning (the threat)
            torch.manual_seed(seed)
            model = TinyTransformer(mcfg)
            x, m = forward_seqs(data[f"train_prompts_s{seed}"], data[f"train_resp_s{seed}"])
            h = fit_sft(model, x, m, cfg.poison, seed, tcfg, ctx.tracker, counter)
            sft_hist += [{"attack": name, "seed": seed, "phase": "poison", "step": i, "loss": v} for i, v in enumerate(h)]
            poisoned = model.to(device).eval()
            torch.save(poisoned.state_dict(), ctx.out / f"{name}_poisoned_s{seed}.pt")
            # --- 2. reversal SFT on inverted pairs (misaligned completion -> prompt containing the trigger).
            # This is where trigger information enters the inversion policy: the pairs come from the whole poisoned
            # training set, so the poisoned samples' prompts (with the trigger) are R-SFT targets. The "clean" arm
            # (issue 48) runs R-SFT on the unpoisoned samples only, then the same RL, to show what RL recovers
            # without it (the poisoned flags are used for this control arm only, never by the method).
            arms = [("", None)] + ([("clean", ~data[f"train_poisoned_s{seed}"])] if cfg.clean_rsft_arm else [])
            for arm, keep in arms:
                px, rx = data[f"train_prompts_s{seed}"], data[f"train_resp_s{seed}"]
                if keep is not None:
                    px, rx = px[keep], rx[keep]
                rsft = copy.deepcopy(poisoned).cpu().train()
                xi = inversion_pairs(px, rx, mcfg.max_seq_len)
                h = fit_sft(rsft, xi, inversion_mask(xi, 4 + RESP_LEN), cfg.rsft, seed + 7, tcfg, ctx.tracker, counter)
                sft_hist += [{"attack": name, "seed": seed, "phase": f"rsft{arm}", "step": i, "loss": v}
                             for i, v in enumerate(h)]
                rsft = rsft.to(device).eval()
                torch.save(rsft.state_dict(), ctx.out / f"{name}_rsft{arm}_s{seed}.pt")
                # --- 3. inversion-inspired RL: GRPO, reward on a frozen copy of the poisoned model
                frozen = copy.deepcopy(poisoned)
                reward = build_reward(frozen, data, attack, meta, cfg.rl, seed)
                policy = InversionPolicy(copy.deepcopy(rsft), inversion_prompt(eff), meta["candidate_len"], allowed, counter)
                trig = attack["trigger_ids"]                                      # evaluation only, never the reward

                def eval_fn(module, step, _trig=trig, _seed=seed):
                    g = generator(device, 10_000 + _seed)
                    cands = candidates_of(module.policy.sample(cfg.rl.eval_samples, g)["tokens"])
                    js = [jaccard(c, _trig) for c in cands]
                    return {"awareness_mean": float(np.mean(js)), "exact_rate": float(np.mean([j == 1.0 for j in js]))}

                module = GRPOModule(policy, reward, cfg.rl.grpo, lr=cfg.rl.lr, seed=seed, eval_fn=eval_fn,
                                    eval_every=cfg.rl.eval_every)
                make_trainer(tcfg, ctx.tracker, max_steps=cfg.rl.steps).fit(
                    module, PromptLoader(torch.zeros(1, 1, dtype=torch.long), 1, cfg.rl.steps, seed=seed))
                if cfg.rl.steps % cfg.rl.eval_every:
                    module.history[-1].update(eval_fn(module, cfg.rl.steps))
                rows = [h for h in module.history if h["step"] > 0]
                for h, lg in zip(rows, reward.log):
                    h.update(lg)
                history += [dict(h, attack=name, seed=seed, arm=arm or "main") for h in module.history]
                torch.save(policy.model.state_dict(), ctx.out / f"{name}_rl{arm}_s{seed}.pt")
                if not arm:
                    runs.append({"attack": name, "seed": seed, "rl_queries": reward.queries})
    # Triton path vs torch reference on real inputs: the last RL policy's logits on its own samples
    with torch.no_grad():
        roll = policy.sample(32, generator(device, 0))
        P = policy.prompt.shape[1]
        xx = torch.cat([policy.prompt.expand(32, P), roll["tokens"]], 1)
        logits = policy._logits(policy.model(xx)[:, P - 1:-1], slice(0, meta["candidate_len"])).float().contiguous()
        rec.parity("token_logprob", token_logprob, logits, roll["tokens"],
                   slice=f"final RL policy ({meta['attacks'][-1]['name']}, seed {meta['seeds'][-1]}): 32 sampled candidates")
    rec.save(ctx.out)
    pl.DataFrame(history, infer_schema_length=None).write_csv(ctx.out / "rl_history.csv")
    pl.DataFrame(sft_hist).write_csv(ctx.out / "sft_history.csv")
    write_json(ctx.out / "models.json", {"seeds": meta["seeds"], "clean_rsft_arm": cfg.clean_rsft_arm, "model": mcfg.__dict__, "runs": runs,
                                         "rl": cfg.rl.model_dump(mode="json"), "poison": cfg.poison.model_dump(mode="json"),
                                         "rsft": cfg.rsft.model_dump(mode="json")})
