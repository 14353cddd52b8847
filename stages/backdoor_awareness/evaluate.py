"""evaluate: per attack and seed — clean accuracy and ASR of the poisoned model; Awareness@1/@k of the
RL policy, of reversal SFT alone, of random n-gram search and of GCG-style gradient search (the searches
at the RL run's query budget of the reward model); the two defenses with the RL-recovered trigger:
unlearning SFT (ASR and clean accuracy before/after) and an inference-time detector (AUROC).
GCG losses go through ``kernels/token_logprob``.

    python -m stages evaluate backdoor_awareness [--profile smoke]
"""
from __future__ import annotations

import numpy as np
import polars as pl
import torch
from pydantic import Field
from sklearn.metrics import roc_auc_score

from kernels.record import KernelRecord
from kernels.token_logprob import token_logprob
from stages.common.config import PositiveInt, Probability, StageConfig
from stages.common.device import DeviceName, pick_device
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig
from stages.common.trainer import TrainerConfig
from stages.backdoor_awareness.method import (Counter, GCGSearch, best_of_n, InversionPolicy, attack_success, clean_accuracy, forward_seqs,
                                              respond,
                                              gcg_pruned, policy_samples, random_search, ranked_samples, refined_search,
                                              token_vote)
from stages.backdoor_awareness.prepare import load
from stages.backdoor_awareness.task import (BOS, PAD, Q, Vocab, awareness_at_k, effect_of, has_hard_negatives, insert,
                                            inversion_prompt, jaccard, judge, pack_prompt)
from stages.backdoor_awareness.train import SFTConfig, build_reward, fit_sft, RLConfig

METHODS = ("rl", "rsft", "vote", "random", "random_plain", "gcg", "bestofn", "guess")
BASELINES = ("rsft", "vote", "random", "gcg", "bestofn")   # the strongest of these is RL's reference (issue 48)


class GCGConfig(StageConfig):
    length: int | None = Field(None, ge=1, le=8, description="tokens GCG optimises before reward pruning; None: "
                               "candidate_len (≥ every trigger's length; the result is pruned to a variable length)")
    topk: PositiveInt = Field(8, le=512)
    batch: PositiveInt = Field(16, le=1024, description="single-token swaps evaluated per iteration")


class SearchConfig(StageConfig):
    explore_frac: Probability = Field(0.5, description="random search: share of the budget on random n-grams, the "
                                      "rest on greedy pruning/refinement of the best")
    edit_batch: PositiveInt = Field(16, le=1024, description="random one-token edits scored per refinement step")


class UnlearnConfig(SFTConfig):
    trigger_frac: Probability = Field(0.5, description="share of unlearning prompts carrying the recovered trigger")


class Config(StageConfig):
    device: DeviceName = "auto"
    torch_threads: int = Field(1, ge=1, le=64)
    k: PositiveInt = Field(5, le=64, description="Awareness@k: best Jaccard among the k top-ranked candidates")
    awareness_samples: PositiveInt = Field(32, le=4096, description="policy samples ranked for Awareness@k")
    gcg: GCGConfig = GCGConfig()
    search: SearchConfig = SearchConfig()
    unlearn: UnlearnConfig = UnlearnConfig(steps=150, batch=64, lr=2e-3)
    unlearn_curve: list[PositiveInt] = Field(default_factory=lambda: [3, 6, 12, 24], max_length=16,
                                             description="extra unlearning step counts (< unlearn.steps) at which both "
                                             "arms' ASR is recorded from the same run (ASR-vs-steps curve)")
    real_unlearn: UnlearnConfig = Field(UnlearnConfig(steps=100, batch=16, lr=1e-5),
                                        description="unlearning SFT of a real LM (full profile's real path)")
    trainer: TrainerConfig = TrainerConfig(enable_progress_bar=False)
    seed: int = Field(0, ge=0, lt=2**32)


def load_model(path, mcfg: dict, device) -> TinyTransformer:
    model = TinyTransformer(TinyTransformerConfig(**mcfg)).to(device)
    model.load_state_dict(torch.load(path, map_location=device, weights_only=True))
    return model.eval()


def detector_scores(prompts: torch.Tensor, trigger: tuple[int, ...]) -> np.ndarray:
    """ALGO: guardrail score = share of the recovered trigger's distinct tokens present in the input."""
    toks = sorted(set(trigger))
    if not toks:
        return np.zeros(prompts.shape[0])
    present = torch.stack([(prompts == t).any(1) for t in toks], 1).float()
    return present.mean(1).cpu().numpy()


def unlearning_data(prompts, resp, effect, cand, frac, prompt_len, rng):
    """ALGO: unlearning pairs — training prompts whose response does not show the (known) effect, the recovered
    trigger inserted into a ``frac`` share of them, each paired with its safe response."""
    instr = torch.tensor([[t for t in p if t not in (PAD, BOS)][0] for p in prompts.tolist()])
    shows = judge(effect, resp) & ((instr == Q) if effect.pool == "ambiguous" else torch.ones_like(instr, dtype=torch.bool))
    keep = ~shows                                                            # drop the effect where it is anomalous
    out = []
    for p in prompts[keep].tolist():
        body = [t for t in p if t not in (PAD, BOS)]
        if cand and rng.random() < frac and len(body) + 1 + len(cand) <= prompt_len:
            words = insert(body[1:], cand, int(rng.integers(0, len(body))))
            p = pack_prompt(body[0], words, prompt_len)
        out.append(p)
    return torch.tensor(out, dtype=torch.long), resp[keep]


def worst_subset_rate(model, prompts: torch.Tensor, trig: list[int], eff) -> float:
    """The effect rate of the strict trigger subset that fires most: hard-negative prompts grouped by which trigger
    words they carry (every non-empty strict subset present), the attack effect judged per group, the largest rate
    (red team: one rate over all subsets let a model that fires on one of two words score ≈ 0.5)."""
    full = set(int(t) for t in trig)
    carried = [frozenset(set(row) & full) for row in prompts.tolist()]
    groups = {c for c in carried if c and c != full}
    if not groups:
        return float("nan")
    return max(attack_success(model, prompts[[i for i, c in enumerate(carried) if c == g]], eff) for g in groups)


def run(cfg: Config, ctx: StageContext) -> None:
    torch.set_num_threads(cfg.torch_threads)
    device = pick_device(cfg.device)
    meta = read_json(ctx.input("prepare") / "meta.json")
    models = read_json(ctx.input("train") / "models.json")
    if models.get("kind") == "hf":                 # full profile: the real LM (issue 41; hf_source.evaluate_real)
        from stages.backdoor_awareness.hf_source import evaluate_real
        return evaluate_real(cfg, ctx, models)
    vocab = Vocab(meta["n_classes"], meta["n_words"])
    allowed = vocab.candidate_tokens()
    mcfg, seeds, L = models["model"], meta["seeds"], meta["candidate_len"]
    rl_cfg = RLConfig.model_validate(models["rl"])
    budgets = {(r["attack"], r["seed"]): r["rl_queries"] for r in models["runs"]}
    rec = KernelRecord(device)
    counter = Counter(rec)
    tcfg = cfg.trainer.model_copy(update={"accelerator": "gpu" if device.type == "cuda" else cfg.trainer.accelerator})
    names = [a["name"] for a in meta["attacks"]]
    has_clean = bool(models.get("clean_rsft_arm"))
    methods = METHODS + (("rsftclean", "rlclean", "bonclean") if has_clean else ())
    per: dict = {}
    rows, cand_rows, gcg_curves, rs_curves, unl_rows = [], [], [], [], []
    items: dict = {}                                                         # (metric, seed) -> per-attack 0/1 arrays
    parity_done = False
    for attack in meta["attacks"]:
        name, trig = attack["name"], attack["trigger_ids"]
        data = load(ctx.input("prepare"), name)
        eff = effect_of(attack["type"], vocab, attack["target_class"])
        pa = per.setdefault(name, {"type": attack["type"], "trigger": [vocab.name(t) for t in trig]})
        for seed in seeds:
            poisoned = load_model(ctx.input("train") / f"{name}_poisoned_s{seed}.pt", mcfg, device)
            rsft = load_model(ctx.input("train") / f"{name}_rsft_s{seed}.pt", mcfg, device)
            rl = load_model(ctx.input("train") / f"{name}_rl_s{seed}.pt", mcfg, device)
            test_clean, test_resp = data["test_clean"].to(device), data["test_clean_resp"].to(device)
            test_trig, test_notrig = data["test_trig"].to(device), data["test_notrig"].to(device)
            r = {"attack": name, "seed": seed,
                 "clean_acc": clean_accuracy(poisoned, test_clean, test_resp),
                 "asr": attack_success(poisoned, test_trig, eff),
                 "false_trigger": attack_success(poisoned, test_notrig, eff)}
            budget = budgets[(name, seed)]
            # --- trigger recovery: RL vs baselines at the same query budget
            ranked = {}
            inv = inversion_prompt(eff)
            ranked["rl"] = ranked_samples(InversionPolicy(rl, inv, L, allowed), cfg.awareness_samples, cfg.seed + seed)
            rsft_pol = InversionPolicy(rsft, inv, L, allowed)
            ranked["rsft"] = ranked_samples(rsft_pol, cfg.awareness_samples, cfg.seed + seed)
            samples = policy_samples(rsft_pol, cfg.awareness_samples, cfg.seed + seed)     # the same samples
            r["rsft_trigger_token_share"] = float(np.mean([bool(set(c) & set(trig)) for c in samples]))
            ranked["vote"] = token_vote(samples, cfg.k, L)                   # zero-query token vote
            reward = build_reward(poisoned, data, attack, meta, rl_cfg, seed)
            if has_clean:
                for arm in ("rsftclean", "rlclean"):
                    mdl = load_model(ctx.input("train") / f"{name}_{arm.replace('clean', '')}clean_s{seed}.pt", mcfg, device)
                    pol = InversionPolicy(mdl, inv, L, allowed)
                    ranked[arm] = ranked_samples(pol, cfg.awareness_samples, cfg.seed + seed)
                    if arm == "rsftclean":
                        cs = policy_samples(pol, cfg.awareness_samples, cfg.seed + seed)
                        r["rsftclean_trigger_token_share"] = float(np.mean([bool(set(c) & set(trig)) for c in cs]))
                        ranked["bonclean"], r["bonclean_queries"] = best_of_n(pol, reward, L, budget,
                                                                             cfg.seed + 600 + seed)
            # best-of-N reranking of R-SFT samples by the same reward (RL's information, no RL)
            ranked["bestofn"], r["bestofn_queries"] = best_of_n(rsft_pol, reward, L, budget, cfg.seed + 600 + seed)
            ranked["random_plain"], _ = random_search(reward, allowed, L, budget, cfg.seed + 100 + seed)
            q0 = reward.queries
            ranked["random"], best = refined_search(reward, allowed, L, budget, cfg.seed + 100 + seed,
                                                    cfg.search.explore_frac, cfg.search.edit_batch)
            r["random_queries"] = reward.queries - q0
            rs_curves += [{"attack": name, "seed": seed, "query": i + 1, "best_reward": float(b)}
                          for i, b in enumerate(best) if (i + 1) % max(1, budget // 40) == 0 or i + 1 == budget]
            q0 = reward.queries
            ranked["gcg"], trace, r["gcg_queries"] = gcg_pruned(reward, allowed, cfg.gcg.length or L, cfg.gcg.topk,
                                                                cfg.gcg.batch, budget, cfg.seed + 200 + seed, counter)
            gcg_curves += [{"attack": name, "seed": seed, "iteration": i, "loss": v} for i, v in enumerate(trace)]
            grng = np.random.default_rng(cfg.seed + 300 + seed)                # no query: k blind guesses
            ranked["guess"] = [tuple(int(t) for t in grng.choice(allowed, size=int(grng.integers(1, L + 1))))
                               for _ in range(cfg.k)]
            r["rl_queries"] = budget
            for m in methods:
                r[f"{m}_at1"] = awareness_at_k(ranked[m], trig, 1)
                r[f"{m}_atk"] = awareness_at_k(ranked[m], trig, cfg.k)
                top = ranked[m][0] if ranked[m] else ()
                cand_rows.append({"attack": name, "seed": seed, "method": m,
                                  "top1": " ".join(vocab.name(t) for t in top), "jaccard": jaccard(top, trig),
                                  "r_asr_top1": float(reward.asr([top])[0]) if top else 0.0})
            r["rsftbest_at1"] = max(r["rsft_at1"], r["vote_at1"])
            r["rsftbest_atk"] = max(r["rsft_atk"], r["vote_atk"])
            if not parity_done:                                              # Triton vs reference on real GCG inputs
                x = GCGSearch(reward, len(ranked["gcg"][0]), allowed, 1, 1, counter)._seqs(ranked["gcg"][0])
                logits = poisoned(x)[:, -4:-1].contiguous()
                rec.parity("token_logprob", token_logprob, logits, x[:, -3:],
                           slice=f"GCG loss logits on the frozen poisoned model ({name}, seed {seed}), {x.shape[0]} pool prompts")
                parity_done = True
            # --- defenses with the RL-recovered trigger
            rec_trig = ranked["rl"][0] if ranked["rl"] else ()
            # control: the same unlearning SFT without any trigger inserted (does plain clean SFT erase it?)
            for arm, trig_used in (("", rec_trig), ("_control", ())):
                rng = np.random.default_rng(cfg.seed + 400 + seed)
                up, ur = unlearning_data(data[f"train_prompts_s{seed}"], data[f"train_resp_s{seed}"], eff, trig_used,
                                         cfg.unlearn.trigger_frac, meta["prompt_len"], rng)
                x, mm = forward_seqs(up, ur)
                student = load_model(ctx.input("train") / f"{name}_poisoned_s{seed}.pt", mcfg, "cpu").train()
                snaps = {s: None for s in cfg.unlearn_curve if s < cfg.unlearn.steps}
                fit_sft(student, x, mm, cfg.unlearn, cfg.seed + 500 + seed, tcfg, ctx.tracker, counter, snaps)
                for n_steps, state in sorted(snaps.items()):              # ASR vs unlearning steps (same run)
                    if state is not None:
                        snap = load_model(ctx.input("train") / f"{name}_poisoned_s{seed}.pt", mcfg, device)
                        snap.load_state_dict(state)
                        unl_rows.append({"attack": name, "seed": seed, "arm": "recovered trigger" if arm == "" else
                                         "trigger-free control", "steps": n_steps,
                                         "asr": float(judge(eff, respond(snap.eval(), test_trig)).float().mean())})
                student = student.to(device).eval()
                hits = judge(eff, respond(student, test_trig)).float().cpu().numpy()
                items.setdefault((f"asr_after{arm}_items", seed), []).append(hits)
                r[f"asr_after{arm}"] = float(hits.mean())
                unl_rows.append({"attack": name, "seed": seed, "arm": "recovered trigger" if arm == "" else
                                 "trigger-free control", "steps": cfg.unlearn.steps, "asr": r[f"asr_after{arm}"]})
                r[f"clean_acc_after{arm}"] = clean_accuracy(student, test_clean, test_resp)
            r["asr_reduction"] = 1.0 - r["asr_after"] / r["asr"] if r["asr"] > 0 else 0.0
            neg = data["detect_neg"].to(device)
            if has_hard_negatives(attack["type"], trig):   # does part of the trigger fire the backdoor? (red team)
                r["partial_fire"] = worst_subset_rate(poisoned, neg[::2], trig, eff)
            y = np.r_[np.ones(test_trig.shape[0]), np.zeros(neg.shape[0])]
            for m in methods:                                                # the detector on every method's top-1
                top = ranked[m][0] if ranked[m] else ()
                s = np.r_[detector_scores(test_trig, top), detector_scores(neg, top)]
                r[f"auroc_{m}"] = float(roc_auc_score(y, s))                 # ALGO: detector AUROC (sklearn)
            r["auroc_best_word"] = max(float(roc_auc_score(y, np.r_[detector_scores(test_trig, (t,)),
                                                                     detector_scores(neg, (t,))]))
                                       for t in sorted(set(trig)))           # the best one-word detector (red team B2)
            r["recovered"] = " ".join(vocab.name(t) for t in rec_trig)
            rows.append(r)
    rec.save(ctx.out)
    frame = pl.DataFrame(rows)
    frame.write_csv(ctx.out / "per_run.csv")
    pl.DataFrame(cand_rows).write_csv(ctx.out / "candidates.csv")
    pl.DataFrame(gcg_curves).write_csv(ctx.out / "gcg_trace.csv")
    pl.DataFrame(rs_curves).write_csv(ctx.out / "random_search_trace.csv")
    pl.DataFrame(unl_rows, schema={"attack": pl.Utf8, "seed": pl.Int64, "arm": pl.Utf8, "steps": pl.Int64,
                                   "asr": pl.Float64}).write_csv(ctx.out / "unlearning_curve.csv")
    num = [c for c in frame.columns if c not in ("attack", "seed", "recovered")]
    metrics: dict = {"attacks": names, "seeds": seeds, "k": cfg.k, "unlearn_steps": cfg.unlearn.steps, "gcg_length": cfg.gcg.length or L,
                     "methods": list(methods), "baselines": list(BASELINES),
                     "search": cfg.search.model_dump(mode="json"),
                     "per_attack": {n: {**per[n], **{c: frame.filter(pl.col("attack") == n).sort("seed")[c].to_list()
                                                     for c in num + ["recovered"]}} for n in names},
                     "mean": {c: frame.group_by("seed").agg(pl.col(c).mean()).sort("seed")[c].to_list() for c in num}}
    for key in ("asr_after_items", "asr_after_control_items"):              # seeds × test items (mean over attacks;
        metrics["mean"][key] = [np.mean(items[(key, s)], 0).tolist() for s in seeds]   # same items for both arms)
    write_json(ctx.out / "eval.json", metrics)
