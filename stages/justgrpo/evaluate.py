"""evaluate: (1) the flexibility trap on the pretrained base dLLM (one sampling stream per seed) —
trace-level and answer-level pass@k (unbiased estimator, k up to n_samples, T = 1) under AR order vs
low-confidence arbitrary order, per test prompt, and the predictive entropy of fork tokens at the
moment each sampler decodes them and how often a prompt's samples take both fork branches; (2) greedy answer- and trace-level correctness, per test prompt, of
the base model and both RL arms of every seed with semi-AR parallel decoding at 1, 2 and 4 tokens per step, and
with fully arbitrary-order decoding (one block, 1 token per step).
Sampler confidences and token log-probs go through ``kernels/token_logprob``.

    python -m stages evaluate justgrpo [--profile smoke]
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import torch
from pydantic import Field, field_validator, model_validator

from kernels.record import KernelRecord
from kernels.token_logprob import token_logprob
from stages.common.config import PositiveInt, StageConfig, unique_items
from stages.common.device import DeviceName, generator, pick_device
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig
from stages.justgrpo.dllm import Counter, decode, greedy_items
from stages.common.jobs import payload, run_jobs
from stages.justgrpo.prepare import load_prompts
from stages.justgrpo.task import MASK, PROMPT_LEN, answers, correct, is_fork, trace_valid

SAMPLERS = {"ar": (1, 1), "arbitrary": (None, 1)}   # name -> (block_len (None = whole generation), tokens/step)


class Config(StageConfig):
    device: DeviceName = "auto"
    torch_threads: int = Field(1, ge=1, le=64)
    workers: int = Field(1, ge=1, le=64, description=(
        "processes for the independent pass@k streams and greedy decodes, one intra-op thread each (1: in this "
        "process, same results)"))
    n_samples: PositiveInt = Field(64, le=1024, description="samples per prompt for pass@k (T = 1)")
    ks: list[PositiveInt] = Field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64], min_length=1, max_length=16)
    claim_k: PositiveInt = Field(16, le=1024, description="the k at which the coverage claim reads pass@k (fixed before the run)")
    passk_prompts: PositiveInt = Field(100, le=10_000, description="test prompts for pass@k and fork entropy")
    eval_prompts: PositiveInt = Field(500, le=10_000, description="test prompts for greedy accuracy")
    tokens_per_step: list[PositiveInt] = Field(default_factory=lambda: [1, 2, 4], min_length=1, max_length=8)
    eval_block: PositiveInt = Field(5, le=32, description="semi-AR block length of the greedy evaluation")
    sample_batch: PositiveInt = Field(1024, le=65536)
    seed: int = Field(0, ge=0, lt=2**32, description="sampling seed (per model: seed + run seed)")

    @field_validator("ks", "tokens_per_step")
    @classmethod
    def _distinct(cls, v, info):
        return unique_items(v, info.field_name)

    @model_validator(mode="after")
    def _k(self):
        if max(self.ks) > self.n_samples:
            raise ValueError(f"ks: k = {max(self.ks)} is larger than n_samples = {self.n_samples} "
                             "(the unbiased pass@k estimator needs n ≥ k)")
        if self.claim_k not in self.ks:
            raise ValueError(f"claim_k: {self.claim_k} is not one of ks {self.ks}")
        if max(self.tokens_per_step) > self.eval_block:
            raise ValueError(f"tokens_per_step: {max(self.tokens_per_step)} exceeds eval_block {self.eval_block}")
        return self


def pass_at_k(n: int, c: np.ndarray, k: int) -> np.ndarray:
    """ALGO: unbiased pass@k (Chen et al. 2021): 1 − C(n−c, k)/C(n, k), as a stable product."""
    out = np.ones(len(c))
    for j, cj in enumerate(c):
        if n - cj >= k:
            out[j] = 1.0 - np.prod(1.0 - k / np.arange(n - cj + 1, n + 1))
    return out


def load_model(path, mcfg: dict, device) -> TinyTransformer:
    model = TinyTransformer(TinyTransformerConfig(**mcfg)).to(device)
    model.load_state_dict(torch.load(path, map_location=device, weights_only=True))
    return model.eval()


@torch.no_grad()
def sample_stats(model, prompts, gen_len: int, sampler: str, n: int, batch: int, g, counter) -> dict:
    """n samples per prompt: per-prompt answer- and trace-level correct counts, fork-position entropy and
    decode step."""
    block, tps = SAMPLERS[sampler]
    block = gen_len if block is None else block
    rows = prompts.repeat_interleave(n, 0)
    ok, tr, ent0, step0, first = [], [], [], [], []
    for i in range(0, rows.shape[0], batch):
        p = rows[i:i + batch]
        gen, info = decode(model, p, gen_len, block, tps, 1.0, g, counter)
        ok.append(correct(gen, answers(p)))
        tr.append(trace_valid(gen, p))
        ent0.append(info["entropy"][:, 0])
        first.append(gen[:, 0])
        step0.append(info["step"][:, 0].float() / (info["n_steps"] - 1))
    ok = torch.cat(ok).view(-1, n)
    tr = torch.cat(tr).view(-1, n)
    fork = is_fork(prompts)
    ent0 = torch.cat(ent0).view(-1, n)
    step0 = torch.cat(step0).view(-1, n)
    # fork branches: which ones-column order each sample took (first token b = prompt order, d = swapped)
    first = torch.cat(first).view(-1, n)
    left, right = first == prompts[:, 1:2], first == prompts[:, 4:5]
    both_any = (left.any(1) & right.any(1))[fork]
    both_valid = ((left & tr).any(1) & (right & tr).any(1))[fork]
    return {"c_answer": ok.sum(1).cpu().numpy(), "c_trace": tr.sum(1).cpu().numpy(),
            "both_orders": both_any.int().tolist(), "both_orders_valid": both_valid.int().tolist(),
            "fork_entropy": float(ent0[fork].mean()), "nonfork_entropy": float(ent0[~fork].mean()),
            "fork_decode_step": float(step0[fork].mean())}


def eval_run(job: tuple[str, int, str]) -> dict:
    """One independent piece of the evaluation (a job of ``jobs.run_jobs``: inputs from its payload):
    ("passk", seed, sampler): n samples per pass@k prompt from the base under that sampler, from the generator
    seeded ``evaluate.seed + seed``; ("greedy", seed, model): greedy items of a model (base, or an arm of that
    seed) under every decoder. Returns the stats and the token_logprob call count."""
    kind, seed, name = job
    p = payload()
    cfg, device, gen_len = Config.model_validate(p["cfg"]), torch.device(p["device"]), p["gen_len"]
    rec = KernelRecord(device)
    counter = Counter(rec)
    ckpt = "base.pt" if kind == "passk" or name == "base" else f"{name}_s{seed}.pt"   # pass@k: of the base
    model = load_model(Path(p["train_dir"]) / ckpt, p["model"], device)
    if kind == "passk":
        g = generator(device, cfg.seed + seed)
        out = sample_stats(model, p["pk_prompts"].to(device), gen_len, name, cfg.n_samples, cfg.sample_batch, g,
                           counter)
    else:
        acc = p["acc_prompts"].to(device)
        out = {"items": {key: greedy_items(model, acc, gen_len, block, tps, counter)
                         for key, block, tps in p["decoders"]}}
    return dict(out, calls=rec.to_dict().get("token_logprob", {}).get("calls", 0))


def run(cfg: Config, ctx: StageContext) -> None:
    torch.set_num_threads(cfg.torch_threads)
    device = pick_device(cfg.device)
    info = read_json(ctx.input("train") / "models.json")
    if info.get("kind") == "hf":                   # full profile: the real dLLM (issue 41; hf_source.evaluate_real)
        from stages.justgrpo.hf_source import evaluate_real
        return evaluate_real(cfg, ctx, info)
    seeds, gen_len, mcfg = info["seeds"], info["gen_len"], info["model"]
    arms = info["arms"] + info.get("controls", [])          # RL arms and the continued-pretraining control
    if cfg.eval_block > gen_len:
        raise ValueError(f"eval_block: {cfg.eval_block} exceeds gen_len {gen_len}")
    test = load_prompts(ctx.input("prepare"), "test").to(device)
    for name, n in (("passk_prompts", cfg.passk_prompts), ("eval_prompts", cfg.eval_prompts)):
        if n > len(test):
            raise ValueError(f"{name}: {n} is more than the {len(test)} test prompts")
    pk_prompts, acc_prompts = test[: cfg.passk_prompts], test[: cfg.eval_prompts]
    guess = read_json(ctx.input("prepare") / "meta.json").get("guess_rate")
    rec = KernelRecord(device)
    passk_rows, acc_rows = [], []
    metrics: dict = {"seeds": seeds, "ks": cfg.ks, "claim_k": cfg.claim_k, "n_samples": cfg.n_samples,
                     "passk": {}, "passk_items": {}, "fork": {}, "acc": {}, "trace_acc": {}, "guess_rate": guess,
                     "n_fork_prompts": int(is_fork(pk_prompts).sum()), "passk_prompts": int(len(pk_prompts)),
                     "eval_prompts": int(len(acc_prompts))}
    # independent runs (one sampler's pass@k stream per seed, one model's greedy decodes), longest first, in a
    # pool of single-threaded processes; each draws only from its own seeded generator
    decoders = [(f"tps{t}", cfg.eval_block, t) for t in cfg.tokens_per_step] + [("full_arbitrary", gen_len, 1)]
    jobs = ([("passk", seed, sampler) for seed in seeds for sampler in SAMPLERS] + [("greedy", 0, "base")]
            + [("greedy", seed, name) for seed in seeds for name in arms])
    data = {"cfg": cfg.model_dump(mode="json"), "device": str(device), "gen_len": gen_len, "model": mcfg,
            "train_dir": str(ctx.input("train")), "pk_prompts": pk_prompts.cpu(), "acc_prompts": acc_prompts.cpu(),
            "decoders": decoders}
    done = {job: r for job, r in zip(jobs, run_jobs(eval_run, jobs, data, cfg.workers))}
    for seed in seeds:
        # --- 1. flexibility trap on the pretrained dLLM (this seed's sampling stream)
        for sampler in SAMPLERS:
            st = done[("passk", seed, sampler)]
            rec.count("token_logprob", st.pop("calls"))
            for level in ("trace", "answer"):
                per_k = {k: pass_at_k(cfg.n_samples, st[f"c_{level}"], k) for k in cfg.ks}
                pk = metrics["passk"].setdefault(sampler, {}).setdefault(level, {})
                for k, v in per_k.items():
                    se = float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else float("nan")
                    passk_rows.append({"seed": seed, "sampler": sampler, "level": level, "k": k,
                                       "pass_at_k": float(v.mean()), "item_se": se})
                    pk.setdefault(f"pass{k}", []).append(float(v.mean()))
                # per-prompt lists at the claim's k and at k = 1: the verdicts' paired item noise
                items = metrics["passk_items"].setdefault(sampler, {})
                items.setdefault(f"{level}_at_claim_k", []).append([float(x) for x in per_k[cfg.claim_k]])
                if 1 in per_k:
                    items.setdefault(f"{level}_pass1", []).append([float(x) for x in per_k[1]])
            fk = metrics["fork"].setdefault(sampler, {})
            for key in ("fork_entropy", "nonfork_entropy", "fork_decode_step", "both_orders", "both_orders_valid"):
                fk.setdefault(key, []).append(st[key])
        # --- 2. greedy accuracy with parallel decoding (semi-AR blocks, low-confidence remasking, T = 0); greedy
        # decoding of the one base is deterministic: decoded once, read for every seed
        for name in ["base"] + arms:
            r = done[("greedy", 0, "base")] if name == "base" else done[("greedy", seed, name)]
            if name != "base" or seed == seeds[0]:
                rec.count("token_logprob", r["calls"])
            for key, block, tps in decoders:
                items = r["items"][key]
                acc_rows.append({"seed": seed, "model": name, "decoder": "full_arbitrary" if key == "full_arbitrary" else "semi_ar",
                                 "tokens_per_step": tps, "acc": float(np.mean(items["answer"])),
                                 "trace_acc": float(np.mean(items["trace"]))})
                metrics["acc"].setdefault(name, {}).setdefault(key, []).append(items["answer"])
                metrics["trace_acc"].setdefault(name, {}).setdefault(key, []).append(items["trace"])
    # Triton path vs torch reference on real sampler inputs (the base model)
    base = load_model(ctx.input("train") / "base.pt", mcfg, device)
    with torch.no_grad():
        x = torch.cat([pk_prompts[:24], torch.full((min(24, len(pk_prompts)), gen_len), MASK, device=device)], 1)
        logits = base(x)[:, PROMPT_LEN:].float()
        rec.parity("token_logprob", lambda l, t, backend: token_logprob(l, t, with_entropy=True, backend=backend),
                   logits.contiguous(), logits.argmax(-1),
                   slice="base dLLM: first-step logits of 24 test prompts (logp and entropy)")
    rec.save(ctx.out)
    pl.DataFrame(passk_rows).write_csv(ctx.out / "passk.csv")
    pl.DataFrame(acc_rows).write_csv(ctx.out / "accuracy.csv")
    write_json(ctx.out / "eval.json", metrics)
