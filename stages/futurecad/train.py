"""train: per seed, (1) BRepGround-mini on the training parts' queries — present targets and queries whose
answer is "no such feature" (empty target) — with a validation curve (mAP, exact-set accuracy, abstention on
the validation parts) and an abstention calibration table; (2) the program model (prefix-LM, description →
CadQuery-like script whose fillet/chamfer step carries a query) in two arms at equal compute, each with its own
learning rates: **SFT+RL** (an SFT checkpoint, warmup-stable-decay lr, then GSPO through the shared trainer
``stages.common.grpo`` on RL prompts that SFT never saw) and **SFT-only** (its own SFT run from the same
initialisation for the checkpoint's steps + the RL steps' compute), with

    # ALGO: reward r = executes(script) × (1 − min(1, CD(script solid, target solid) / diag(target)))
    # ALGO: GSPO sequence ratio s_i = (π_θ(y_i|x)/π_old(y_i|x))^(1/|y_i|), clipped, ≥ 2 updates per batch

The RL policy is the model at temperature τ (``rollout_temperature``: rollouts and the ratio's log-probs alike);
both arms keep the state with the best greedy validation reward among their state at the RL arm's start compute
and ``curve_points`` points after it, the last step included (the SFT-only arm also the RL arm's SFT checkpoint, with
``sft_only_candidates: with_checkpoint``: the strongest SFT model at no more than the RL arm's compute). Equal compute counts transformer token passes (a
backward pass = 2 forwards): an RL step costs
P·G·(Lp+Ls)·(1 rollout + 1 old-logp pass + 3·ppo_epochs), an SFT step B·(Lp+Ls)·3, so the SFT-only arm gets
⌈rl_steps·P·G·(2 + 3·ppo_epochs) / (3·B)⌉ more SFT steps (``equal_compute_sft_steps``). Both arms record a
validation curve (greedy decoding of the validation prompts) at matched compute.

Scripts run in the CAD sandbox (``sandbox.CadSandbox``: worker processes that die with the stage), their
Query(...) operands grounded by the environment grounder (the first seed's BRepGround-mini, the same for
every program-model seed); CD goes through kernels/chamfer.

The grounder seeds and the program-model seeds are independent runs (``ground_run``, ``program_run``), each
seeded from its own seed only, run in a pool of ``workers`` single-threaded processes
(``stages.common.jobs``; ``workers: 1`` runs them in this process with the same results). A pooled program
run executes its scripts in a sandbox of its own with ``sandbox_workers // workers`` CAD workers (at least 1),
so the pool does not multiply the CAD processes; in this process it uses the stage's one sandbox.

    python -m stages train futurecad [--profile smoke]
"""
from __future__ import annotations

import copy
import json
import math
from typing import Literal
from pathlib import Path

import lightning as L
import numpy as np
import polars as pl
import torch
from pydantic import Field, model_validator

from kernels.chamfer import chamfer_distance
from kernels.record import KernelRecord
from kernels.token_logprob import token_logprob
from stages.common.config import PositiveInt, StageConfig
from stages.common.device import DeviceName, pick_device
from stages.common.grpo import GRPOConfig, GRPOModule, PromptLoader
from stages.common.jobs import payload, run_jobs
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig
from stages.common.trainer import TrainerConfig, make_trainer
from stages.futurecad import cad, cputime
from stages.futurecad.infer import EMPTY_KINDS, ProgramScorer, decide, load_parts, query_tensors
from stages.futurecad.lit import GroundModule, SFTModule
from stages.futurecad.model import (BRepGround, GroundLoader, RowLoader, ScriptPolicy, build_program_vocab,
                                    build_vocab, decode_script, encode_prompt, encode_script, known_words,
                                    label_matrix, pad_parts, predict, ranking_metrics, sample_scripts)
from stages.futurecad.sandbox import CadSandbox, exit_fast_when_interrupted

CALIBRATION_GRID = tuple(round(x, 2) for x in np.arange(0.05, 1.0, 0.05))


class GroundConfig(StageConfig):
    d_model: int = Field(64, ge=8, le=1024)
    n_heads: int = Field(4, ge=1, le=32)
    text_layers: int = Field(1, ge=1, le=12)
    fusion_layers: int = Field(2, ge=1, le=24)
    max_words: int = Field(24, ge=8, le=128)
    max_faces: int = Field(32, ge=8, le=4096, description="primitive slots of the model (pad); larger parts are refused")
    max_edges: int = Field(80, ge=8, le=8192)
    steps: PositiveInt = Field(300, le=100_000)
    batch: PositiveInt = Field(32, le=4096)
    per_part: PositiveInt = Field(4, le=256, description="queries per part in a batch (its primitives encoded once)")
    lr: float = Field(2e-3, gt=0, le=1.0)
    eval_every: PositiveInt = Field(50, le=100_000, description="validation-curve interval (steps)")
    threshold: float = Field(0.5, gt=0, lt=1, description="select primitives with σ(score) above this")
    abstain_threshold: float = Field(0.5, gt=0, lt=1, description="answer 'no match' when the top σ(score) is "
                                     "below this (or no query word is known); set before any run, equal to the "
                                     "selection threshold (the validation calibration table, calibration.csv, is "
                                     "reported beside it)")

    @model_validator(mode="after")
    def _heads(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"ground.n_heads: {self.n_heads} must divide d_model {self.d_model}")
        return self


def equal_compute_sft_steps(pc) -> int:
    """SFT steps with the compute of ``rl_steps`` GSPO steps (token passes; backward = 2 forwards)."""
    g = pc["grpo"] if isinstance(pc, dict) else pc.grpo.model_dump()
    get = (lambda k: pc[k]) if isinstance(pc, dict) else (lambda k: getattr(pc, k))
    per_rl = get("prompts_per_step") * g["group_size"] * (2 + 3 * g["ppo_epochs"])
    return math.ceil(get("rl_steps") * per_rl / (3 * get("sft_batch")))


class ProgramConfig(StageConfig):
    d_model: int = Field(64, ge=8, le=1024)
    n_layers: int = Field(2, ge=1, le=24)
    n_heads: int = Field(4, ge=1, le=32)
    prompt_len: int = Field(48, ge=8, le=512, description="description tokens (left-padded, ends in BOS)")
    script_len: int = Field(112, ge=16, le=1024, description="script tokens incl. EOS")
    sft_steps: PositiveInt = Field(250, le=100_000, description="SFT steps of the shared checkpoint")
    sft_batch: PositiveInt = Field(32, le=4096)
    sft_lr: float = Field(3e-3, gt=0, le=1.0)
    sft_decay_steps: int = Field(0, ge=0, le=100_000, description=(
        "the last steps of the SFT checkpoint's run with a linearly decaying lr (warmup-stable-decay; 0: constant)"))
    sft_only_lr: float = Field(3e-3, gt=0, le=1.0, description="lr of the SFT-only arm's own run")
    sft_only_decay_steps: int = Field(0, ge=0, le=200_000, description=(
        "the SFT-only arm's run (sft_steps + equal_compute_sft_steps steps from initialisation) decays its lr "
        "linearly over its last this-many steps"))
    rl_steps: int = Field(40, ge=0, le=10_000, description="GSPO steps from the SFT checkpoint (0: no RL arms)")
    prompts_per_step: PositiveInt = Field(8, le=1024)
    rl_lr: float = Field(3e-4, gt=0, le=1.0)
    rollout_temperature: float = Field(0.7, gt=0, le=2.0, description="τ of the RL policy softmax(logits/τ) "
                                       "(sampling and the log-probs of the ratio)")
    n_seeds: int = Field(3, ge=1, le=10, description="program-model seeds (the first n of prepare's seeds)")
    grpo: GRPOConfig = GRPOConfig(group_size=8, clip_eps=0.2, kl_coef=0.0, loss_norm="samples", ppo_epochs=2,
                                  grad_clip=1.0, ratio_level="sequence")
    curve_points: int = Field(8, ge=1, le=1000, description="validation points along each arm's compute")
    sft_only_candidates: Literal["own_run", "with_checkpoint"] = Field("with_checkpoint", description=(
        "the SFT-only arm keeps the best validation state among its own run's candidates (own_run) or among those "
        "and the RL arm's SFT checkpoint (with_checkpoint: the strongest SFT model at no more than the RL arm's "
        "compute; it then spends more compute than SFT+RL, which only makes the comparison harder for RL)"))

    @model_validator(mode="after")
    def _heads(self):
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError(f"program.n_heads: {self.n_heads} must divide d_model {self.d_model} into even head dims")
        if self.sft_decay_steps >= self.sft_steps:
            raise ValueError(f"program.sft_decay_steps: {self.sft_decay_steps} must be below sft_steps {self.sft_steps}")
        only_steps = self.sft_steps + equal_compute_sft_steps(self)
        if self.sft_only_decay_steps >= only_steps:
            raise ValueError(f"program.sft_only_decay_steps: {self.sft_only_decay_steps} must be below the SFT-only "
                             f"arm's {only_steps} steps (sft_steps + the RL steps' compute)")
        if self.rl_steps and self.curve_points > self.rl_steps:
            raise ValueError(f"program.curve_points: {self.curve_points} exceeds rl_steps {self.rl_steps}")
        return self


class Config(StageConfig):
    torch_threads: int = Field(1, ge=1, le=64, description=(
        "intra-op threads of this process's own work (the runs themselves: one thread each, stages.common.jobs)"))
    workers: int = Field(1, ge=1, le=64, description=(
        "processes for the independent runs (grounder seeds, program-model seeds), one intra-op thread each "
        "(1: in this process, same results); a pooled program-model run opens its own CAD sandbox of "
        "max(1, sandbox_workers // workers) workers"))
    device: DeviceName = "auto"
    sandbox_workers: int = Field(2, ge=1, le=32, description="CAD worker processes")
    script_timeout_s: float = Field(120.0, gt=0, le=3600, description="a script running longer kills its worker")
    ground: GroundConfig = GroundConfig()
    program: ProgramConfig = ProgramConfig()
    trainer: TrainerConfig = TrainerConfig(enable_progress_bar=False)


# ----------------------------------------------------------------------------------------------
# program validation
# ----------------------------------------------------------------------------------------------
def greedy_eval(lm, prompts: torch.Tensor, rids: list[int], scorer: ProgramScorer, pvocab: list[str],
                script_len: int) -> dict[str, float]:
    was = lm.training
    lm.eval()
    with torch.no_grad():
        comp = sample_scripts(lm, prompts, script_len, 0.0, None)
    lm.train(was)
    texts = [decode_script(r, pvocab) for r in comp.tolist()]
    s = scorer.score(texts, rids)
    return {"val_reward": float(s["reward"].mean()), "val_exec": float(s["exec"].mean())}


class EvalEvery(L.Callback):
    """Calls fn(module) at step ``start`` (0: before the first step) and every ``every`` optimizer steps after it,
    and at the last step if that was not one of them; rows in ``self.rows``. With ``keep`` (a function of the
    module returning the nn.Module to keep), the state with the best ``best_key`` among these points is kept (early
    stopping on the validation prompts; ties keep the earlier)."""

    def __init__(self, fn, every: int, keep=None, best_key: str = "val_reward", start: int = 0):
        self.fn, self.every, self.start, self.rows = fn, every, start, []
        self.keep, self.best_key, self.best, self.best_step, self.best_state = keep, best_key, -math.inf, 0, None

    def _record(self, module, step):
        if self.rows and self.rows[-1]["step"] == step:
            return
        self._add(step, self.fn(module), lambda: copy.deepcopy(self.keep(module).state_dict()))

    def _add(self, step, metrics: dict, state_of) -> None:
        """A row at ``step``; the best so far (strictly better: ties keep the earlier) keeps ``state_of()``."""
        row = {"step": step, **metrics}
        self.rows.append(row)
        if self.keep is not None and row[self.best_key] > self.best:
            self.best, self.best_step, self.best_state = row[self.best_key], step, state_of()

    def on_train_start(self, trainer, module):
        if self.start == 0:
            self._record(module, 0)

    def on_train_batch_end(self, trainer, module, outputs, batch, idx):
        step = int(trainer.global_step)
        if step >= self.start and (step - self.start) % self.every == 0:
            self._record(module, step)

    def on_train_end(self, trainer, module):
        if int(trainer.global_step) >= self.start:
            self._record(module, int(trainer.global_step))


class SnapshotEvery(EvalEvery):
    """EvalEvery's points, scored after training: at each point the state of ``model_of(module)`` is copied, and
    ``score(fn, model)`` later loads each copy into ``model`` and scores it with ``fn(model)`` (rows, best, best_step,
    best_state as EvalEvery's, ties keep the earlier). The training itself then needs nothing that scoring needs
    (a program run trains both SFT models before the environment grounder exists; the CAD sandbox scores them)."""

    def __init__(self, model_of, every: int, best_key: str = "val_reward", start: int = 0):
        super().__init__(None, every, keep=model_of, best_key=best_key, start=start)
        self.snapshots: list[tuple[int, dict]] = []

    def _record(self, module, step):
        if self.snapshots and self.snapshots[-1][0] == step:
            return
        self.snapshots.append((step, copy.deepcopy(self.keep(module).state_dict())))

    def score(self, fn, model) -> "SnapshotEvery":
        for step, state in self.snapshots:
            model.load_state_dict(state)
            self._add(step, fn(model), lambda state=state: state)
        return self


# ----------------------------------------------------------------------------------------------
# grounding validation
# ----------------------------------------------------------------------------------------------
def ground_val_metrics(net, words, parts, part_rows, rows, g: GroundConfig, vocab) -> tuple[dict, np.ndarray]:
    """mAP / exact-set accuracy on present validation queries (and on those whose size word picks a proper
    subset), abstention rate on empty-target ones."""
    scores, _ = predict(net, words, parts, rows=part_rows)
    scores = scores.cpu().numpy()
    net.train()
    aps, exact, abst, size = [], [], [], []
    tops = np.zeros(len(rows))
    for i, r in enumerate(rows):
        fs, es = scores[i, : g.max_faces], scores[i, g.max_faces:]
        fs, es = fs[fs >= 0], es[es >= 0]
        d = decide(fs, es, known_words(r["query"], vocab), g.threshold, g.abstain_threshold)
        tops[i] = d["top_score"]
        truth = set(json.loads(r["target"]))
        if r["templates"] in EMPTY_KINDS:
            abst.append(float(d["abstained"]))
        else:
            aps.append(ranking_metrics(fs if r["prim"] == "faces" else es, truth)["ap"])
            pred = {("faces", i) for i in d["faces"]} | {("edges", i) for i in d["edges"]}
            exact.append(float(pred == {(r["prim"], i) for i in truth}))
            if r.get("size_matters"):                    # superlative picks a proper subset
                size.append(exact[-1])
    return ({"val_map": float(np.mean(aps)), "val_exact": float(np.mean(exact)),
             "val_size_exact": float(np.mean(size)) if size else float("nan"),
             "val_abstain_empty": float(np.mean(abst)) if abst else float("nan")}, tops)


def calibration_rows(tops: np.ndarray, rows, vocab, seed: int) -> list[dict]:
    """Per threshold: share of present validation queries that would abstain, and of empty-target ones."""
    known = np.array([known_words(r["query"], vocab) > 0 for r in rows])
    empty = np.array([r["templates"] in EMPTY_KINDS for r in rows])
    out = []
    for t in CALIBRATION_GRID:
        abst = (~known) | (tops < t)
        out.append({"seed": seed, "threshold": t, "abstain_present": float(abst[~empty].mean()),
                    "abstain_empty": float(abst[empty].mean()) if empty.any() else float("nan")})
    return out


_SANDBOX: CadSandbox | None = None      # the stage's own sandbox (workers: 1), used by program runs in this process


def run(cfg: Config, ctx: StageContext) -> None:
    global _SANDBOX
    torch.set_num_threads(cfg.torch_threads)
    device = pick_device(cfg.device)
    prep = ctx.input("prepare")
    meta = read_json(prep / "meta.json")
    pc = cfg.program
    # workers: 1 runs every job in this process, sharing one sandbox that starts first (its workers import
    # CadQuery while the grounder trains); with a pool each program-model run opens its own (program_run)
    sandbox = (CadSandbox(meta["n_points"], cfg.sandbox_workers, timeout_s=cfg.script_timeout_s)
               if pc.rl_steps and cfg.workers == 1 else None)
    _SANDBOX = sandbox
    phases: dict[str, float] = {}
    pooled_sandbox: dict[str, float] = {}
    try:
        _run(cfg, ctx, prep, meta, device, sandbox, phases, pooled_sandbox)
    except BaseException as err:
        exit_fast_when_interrupted(err)
        raise
    finally:
        _SANDBOX = None
        if sandbox is not None:
            sandbox.close()
    if sandbox is not None:
        phases.update(sandbox_wait_wall=sandbox.wall_s, scripts_requested=sandbox.requested,
                      scripts_executed=sandbox.executed)
    elif pooled_sandbox:
        phases.update({k: pooled_sandbox[k] for k in ("sandbox_wait_wall", "scripts_requested", "scripts_executed")})
    cputime.record(ctx, phases, sandbox_cpu_s=pooled_sandbox.get("cpu_s", 0.0) if sandbox is None else None)


# ----------------------------------------------------------------------------------------------
# the independent runs (jobs of stages.common.jobs.run_jobs): a grounder seed, a program-model seed
# ----------------------------------------------------------------------------------------------
def run_inputs(cfg: Config, prep, out, device) -> dict:
    """The payload every job reads (plain tensors, lists and dicts; CPU tensors): the grounder's training and
    validation tensors, the program model's rows, prompts and targets, and where outputs go."""
    seeds = read_json(prep / "meta.json")["seeds"]
    g, pc = cfg.ground, cfg.program
    parts = load_parts(prep)
    allq = pl.read_parquet(prep / "queries.parquet")
    q = allq.filter(pl.col("split") == "train").to_dicts()
    vq = allq.filter(pl.col("split") == "val").to_dicts()
    vocab_list = build_vocab(r["query"] for r in q)
    vocab = {w: i for i, w in enumerate(vocab_list)}
    padded = pad_parts(parts, g.max_faces, g.max_edges)

    progs = pl.read_parquet(prep / "programs.parquet").to_dicts()
    tg = torch.load(prep / "program_targets.pt", weights_only=True)
    by_role = {r: [i for i, p in enumerate(progs) if p["role"] == r] for r in ("sft", "rl", "val")}
    sft_progs = [progs[i] for i in by_role["sft"]]
    pvocab_list = build_program_vocab([p["description"] for p in sft_progs], [p["script"] for p in sft_progs])
    pvocab = {t: i for i, t in enumerate(pvocab_list)}
    too_long = [p for p in sft_progs if len(cad.script_tokens(p["script"])) + 1 > pc.script_len]
    if too_long:
        raise ValueError(f"program.script_len: {pc.script_len} is shorter than a training script "
                         f"({len(cad.script_tokens(too_long[0]['script'])) + 1} tokens)")
    rows = torch.tensor([encode_prompt(p["description"], pvocab, pc.prompt_len)
                         + encode_script(p["script"], pvocab, pc.script_len) for p in sft_progs], dtype=torch.long)

    def prompts_of(idx):
        return torch.tensor([encode_prompt(progs[i]["description"], pvocab, pc.prompt_len) for i in idx],
                            dtype=torch.long)

    mcfg = TinyTransformerConfig(vocab_size=len(pvocab_list), d_model=pc.d_model, n_layers=pc.n_layers,
                                 n_heads=pc.n_heads, max_seq_len=pc.prompt_len + pc.script_len, causal=True)
    tcfg = cfg.trainer.model_copy(update={"accelerator": "gpu" if device.type == "cuda" else cfg.trainer.accelerator})
    return {"cfg": cfg.model_dump(mode="json"), "trainer": tcfg.model_dump(mode="json"), "device": str(device),
            "out": str(out), "seeds": seeds,
            # grounder
            "vocab_list": vocab_list, "val_rows": vq, "n_train_queries": len(q), "padded": padded,
            "words": query_tensors(q, vocab, g.max_words), "y": label_matrix(q, padded, g.max_faces, g.max_edges),
            "part_idx": torch.tensor([r["part"] for r in q], dtype=torch.long),
            "vwords": query_tensors(vq, vocab, g.max_words),
            "vrows": torch.tensor([r["part"] for r in vq], dtype=torch.long),
            # program model
            "pvocab_list": pvocab_list, "model": dict(mcfg.__dict__), "rows": rows,
            "n_programs": {k: len(v) for k, v in by_role.items()}, "val_rids": by_role["val"],
            "val_prompts": prompts_of(by_role["val"]),
            "rl_prompts": torch.cat([prompts_of(by_role["rl"]), torch.tensor(by_role["rl"])[:, None]], 1),
            "points": tg["points"], "diags": [p["diag"] for p in progs],
            "equal_compute_sft_steps": equal_compute_sft_steps(pc) if pc.rl_steps else 0,
            # the program runs' CAD sandbox: the environment grounder (the first seed's BRepGround-mini, the same
            # for every program-model seed); in a pool, sandbox_workers shared out among the pool's processes
            "env_grounder": ("model", str(out / f"ground_s{seeds[0]}.pt")),
            "n_points": read_json(prep / "meta.json")["n_points"], "script_timeout_s": cfg.script_timeout_s,
            "sandbox_workers": max(1, cfg.sandbox_workers // cfg.workers)}


def train_run(job: tuple[str, int]) -> dict:
    """One independent run: ``("ground", seed)`` (ground_run) or ``("program", seed)`` (program_run)."""
    kind, seed = job
    if kind == "ground":
        return ground_run(seed)
    if kind == "program":
        return program_run(seed)
    raise ValueError(f"unknown run {job!r}")


def ground_run(seed: int) -> dict:
    """BRepGround-mini of one seed: trains it, saves ``ground_s<seed>.pt``; returns its loss history, validation
    curve and calibration rows (each tagged with the seed) and its CPU seconds."""
    import time

    t0 = time.process_time()
    p = payload()
    g, tcfg = GroundConfig.model_validate(p["cfg"]["ground"]), TrainerConfig.model_validate(p["trainer"])
    device = torch.device(p["device"])
    vocab_list, vq = p["vocab_list"], p["val_rows"]
    vocab = {w: i for i, w in enumerate(vocab_list)}
    padded = p["padded"]
    vwords, vrows = p["vwords"].to(device), p["vrows"].to(device)
    dparts = {k: v.to(device) for k, v in padded.items()}
    torch.manual_seed(seed)
    net = BRepGround(len(vocab_list), g.d_model, g.n_heads, g.text_layers, g.fusion_layers, g.max_words)
    module = GroundModule(net, g.lr)
    cb = EvalEvery(lambda m: ground_val_metrics(m.net, vwords, dparts, vrows, vq, g, vocab)[0], g.eval_every)
    make_trainer(tcfg, None, callbacks=[cb], max_steps=g.steps).fit(           # W&B: the parent logs the rows
        module, GroundLoader(p["words"], p["part_idx"], p["y"], padded, g.batch, g.steps, seed, g.per_part))
    net = net.to(device).eval()
    ground_meta = {"vocab": vocab_list, "ground": g.model_dump(mode="json")}
    path = Path(p["out"]) / f"ground_s{seed}.pt"
    torch.save({"state": net.state_dict(), "meta": json.dumps(ground_meta)}, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").replace(path)            # atomic: a program run in another process waits for it
    _, tops = ground_val_metrics(net, vwords, dparts, vrows, vq, g, vocab)
    return {"kind": "ground", "seed": seed, "history": [dict(h, seed=seed) for h in module.history],
            "curve": [dict(r, seed=seed) for r in cb.rows], "calibration": calibration_rows(tops, vq, vocab, seed),
            "cpu": {"ground": time.process_time() - t0}}


def program_run(seed: int) -> dict:
    """The program model of one seed: its SFT checkpoint, then (rl_steps > 0) the SFT-only arm at equal compute
    and the SFT+RL arm from it. Saves ``sft_s<seed>.pt``, ``sft_more_s<seed>.pt``, ``rl_s<seed>.pt``; returns
    the history rows, validation curves, selected checkpoints, kernel calls and CPU seconds.

    Scripts run in the stage's sandbox when this runs in the stage process (workers: 1); in a pool process, in
    a sandbox of its own (``sandbox_workers`` // ``workers`` CAD workers, at least 1) with the same environment
    grounder, closed when the run ends. A script's result does not depend on which sandbox runs it."""
    import os

    p = payload()
    pc = ProgramConfig.model_validate(p["cfg"]["program"])
    sandbox, own = _SANDBOX, False
    if pc.rl_steps and sandbox is None:
        sandbox, own = CadSandbox(p["n_points"], p["sandbox_workers"], timeout_s=p["script_timeout_s"]), True
    children0 = os.times()
    try:
        out = _program(seed, p, pc, sandbox)
    finally:
        if own:
            sandbox.close()
    if own:                                       # its CAD workers, killed and reaped by close()
        t = os.times()
        out["sandbox"] = {"executed": sandbox.executed, "crashes": sandbox.crashes, "requested": sandbox.requested,
                          "wait_wall": sandbox.wall_s,
                          "cpu_s": (t.children_user + t.children_system
                                    - children0.children_user - children0.children_system)}
    return out


def job_order(seeds: list[int], pseeds: list[int], workers: int, rl: bool) -> list[tuple[str, int]]:
    """The pool's jobs in hand-out order (first in, first out): with RL, the environment grounder (seeds[0]) first
    (every program run waits for it once its SFT models are trained, so it must start before any program run is
    handed out), then the program runs (the longest jobs), then the other grounders, which fill the pool's
    processes as the program runs end. ``workers`` does not change the order."""
    ground = [("ground", s) for s in seeds]
    first = ground[:1] if rl else []
    return first + [("program", s) for s in pseeds] + ground[len(first):]


def ensure_env_grounder(p: dict, sandbox: CadSandbox) -> None:
    """The sandbox grounds with the environment grounder (waiting for its checkpoint when a pool process trains it:
    a pooled run has its own sandbox, the stage's sandbox serves runs in this process, where it came first)."""
    spec = tuple(p["env_grounder"])
    if sandbox.grounder != spec:
        if spec[0] == "model":
            wait_for_env_grounder(Path(spec[1]), sandbox is not _SANDBOX)
        sandbox.set_grounder(spec)


def wait_for_env_grounder(path: Path, pooled: bool, poll_s: float = 0.2, timeout_s: float = 4 * 3600) -> None:
    """A program run needs the first grounder's checkpoint (written atomically by its ground_run). In the stage
    process (workers: 1) that run came first, so a missing file is a bug; in a pool another process may still be
    training it (if that run fails, the pool stops and kills this one)."""
    import time

    t0 = time.monotonic()
    while not path.exists():
        if not pooled:
            raise RuntimeError(f"environment grounder {path} was not written before the program runs")
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(f"environment grounder {path} not written after {timeout_s:g} s")
        time.sleep(poll_s)


SFT_CURVE_POINTS = 2       # the SFT checkpoint's diagnostic validation curve: its start, middle and end


def sft_checkpoint(seed: int, p: dict, pc: ProgramConfig, tcfg: TrainerConfig):
    """The SFT checkpoint the RL arm starts from: ``sft_steps`` steps on the SFT programs at ``sft_lr`` with the WSD
    schedule (stable, then ``sft_decay_steps`` of decay). Returns the model (eval mode), the module (its history)
    and the snapshots of its diagnostic validation curve (``SnapshotEvery``: steps 0, sft_steps // 2, sft_steps;
    score them with ``.score``)."""
    torch.manual_seed(seed)
    lm = TinyTransformer(TinyTransformerConfig(**p["model"]))
    sft = SFTModule(lm, pc.prompt_len, pc.sft_lr, stable=pc.sft_steps - pc.sft_decay_steps, decay=pc.sft_decay_steps)
    cb = SnapshotEvery(lambda m: m.model, max(1, pc.sft_steps // SFT_CURVE_POINTS))
    make_trainer(tcfg, None, callbacks=[cb], max_steps=pc.sft_steps).fit(       # W&B: the parent logs the rows
        sft, RowLoader(p["rows"], pc.sft_batch, pc.sft_steps, seed))
    return lm.to(torch.device(p["device"])).eval(), sft, cb


def sft_only_arm(seed: int, p: dict, pc: ProgramConfig, tcfg: TrainerConfig):
    """The SFT-only arm: its own SFT run from the same initialisation and data stream, sft_steps +
    equal_compute_sft_steps steps (the RL arm's total compute) at ``sft_only_lr`` with its own WSD decay over the last
    ``sft_only_decay_steps``. Candidates for early stopping, like the RL arm's: its state at sft_steps (the RL arm's
    start compute) and every equal_compute_sft_steps // curve_points steps after it, the last step included.
    Returns (module, SnapshotEvery): score the candidates with ``.score(val_fn, model)``; the kept state is the
    best's."""
    extra = p["equal_compute_sft_steps"]
    steps = pc.sft_steps + extra
    torch.manual_seed(seed)
    lm = TinyTransformer(TinyTransformerConfig(**p["model"]))
    sft2 = SFTModule(lm, pc.prompt_len, pc.sft_only_lr, stable=steps - pc.sft_only_decay_steps,
                     decay=pc.sft_only_decay_steps)
    cb = SnapshotEvery(lambda m: m.model, max(1, extra // pc.curve_points), start=pc.sft_steps)
    make_trainer(tcfg, None, callbacks=[cb], max_steps=steps).fit(sft2, RowLoader(p["rows"], pc.sft_batch, steps, seed))
    return sft2, cb


def rl_arm(lm, seed: int, p: dict, pc: ProgramConfig, tcfg: TrainerConfig, val_fn, scorer: ProgramScorer,
           rec: KernelRecord, rl_lr: float | None = None) -> tuple[GRPOModule, dict]:
    """GSPO from the SFT checkpoint ``lm`` (a copy) on the RL prompts (never seen in SFT), reward through the CAD
    sandbox + Chamfer kernel; validation every rl_steps // curve_points steps, the best state kept. Returns the
    module (its history) and ``{"val", "step", "state"}`` of the kept state. ``rl_lr`` overrides ``pc.rl_lr``
    (the development sweep)."""
    def reward_fn(prompts, roll):
        texts = [decode_script(r[pc.prompt_len:], p["pvocab_list"]) for r in roll["tokens"].tolist()]
        return scorer.score(texts, roll["rid"].tolist())["reward"].to(roll["tokens"].device)

    def logprob_fn(logits, tgt):
        rec.count("token_logprob")
        return token_logprob(logits.contiguous(), tgt, backend=rec.backend)

    policy = ScriptPolicy(copy.deepcopy(lm), pc.prompt_len, pc.script_len, logprob_fn, pc.rollout_temperature)
    best = {"val": -math.inf, "step": 0, "state": None}

    def rl_eval(m, step):
        r = val_fn(m.policy.model)
        if r["val_reward"] > best["val"]:
            best.update(val=r["val_reward"], step=step, state=copy.deepcopy(m.policy.model.state_dict()))
        return r

    grpo = GRPOModule(policy, reward_fn, pc.grpo, lr=pc.rl_lr if rl_lr is None else rl_lr, seed=seed,
                      eval_fn=rl_eval, eval_every=max(1, pc.rl_steps // pc.curve_points))
    make_trainer(tcfg, None, max_steps=pc.rl_steps).fit(
        grpo, PromptLoader(p["rl_prompts"], pc.prompts_per_step, pc.rl_steps, seed=seed))
    return grpo, best


def program_val_fn(p: dict, pc: ProgramConfig, scorer: ProgramScorer):
    """Greedy validation reward / executability of a model on the validation prompts."""
    val_prompts, val_rids = p["val_prompts"].to(torch.device(p["device"])), p["val_rids"]
    return lambda model: greedy_eval(model, val_prompts, val_rids, scorer, p["pvocab_list"], pc.script_len)


def _program(seed: int, p: dict, pc: ProgramConfig, sandbox: CadSandbox | None) -> dict:
    import time

    cpu: dict[str, float] = {}
    t0 = time.process_time()

    def tick(name, t0):
        cpu[name] = cpu.get(name, 0.0) + time.process_time() - t0
        return time.process_time()

    tcfg = TrainerConfig.model_validate(p["trainer"])
    device = torch.device(p["device"])
    out_dir = Path(p["out"])
    rec = KernelRecord(device)
    extra = p["equal_compute_sft_steps"]
    sft_hist, rl_hist, curves, selected = [], [], [], None

    # both SFT models train first (no sandbox, no grounder needed); their validation points are scored after
    lm, sft, sft_snaps = sft_checkpoint(seed, p, pc, tcfg)
    torch.save(lm.state_dict(), out_dir / f"sft_s{seed}.pt")
    sft_hist += [dict(h, seed=seed, phase="sft") for h in sft.history]
    t0 = tick("sft", t0)
    if pc.rl_steps:
        # --- SFT-only arm at equal compute (its own run); compute axis: SFT steps beyond sft_steps
        sft2, cb = sft_only_arm(seed, p, pc, tcfg)
        sft_hist += [dict(h, seed=seed, phase="sft_more") for h in sft2.history]
        t0 = tick("sft_more", t0)
    if sandbox is not None:             # scoring and RL need the CAD sandbox (rl_steps > 0)
        ensure_env_grounder(p, sandbox)
        scorer = ProgramScorer(sandbox, p["points"], p["diags"], rec, device)
        val_fn = program_val_fn(p, pc, scorer)
        probe = TinyTransformer(TinyTransformerConfig(**p["model"])).to(device)
        sft_snaps.score(val_fn, probe)
        curves += [{"seed": seed, "arm": "sft", "compute": r["step"] - pc.sft_steps, "val_reward": r["val_reward"],
                    "val_exec": r["val_exec"]} for r in sft_snaps.rows]
        t0 = tick("sft", t0)
        if pc.rl_steps:
            cb.score(val_fn, probe)
            kept_state, kept_step = cb.best_state, cb.best_step - pc.sft_steps
            ck = next(r for r in sft_snaps.rows if r["step"] == pc.sft_steps)         # the RL arm's checkpoint
            if pc.sft_only_candidates == "with_checkpoint" and ck["val_reward"] > cb.best:
                kept_state, kept_step = copy.deepcopy(lm.state_dict()), "checkpoint"
            torch.save(kept_state, out_dir / f"sft_more_s{seed}.pt")
            curves += [{"seed": seed, "arm": "sft_more", "compute": r["step"] - pc.sft_steps, "val_reward": r["val_reward"],
                        "val_exec": r["val_exec"]} for r in cb.rows]
            t0 = tick("sft_more", t0)
            # --- SFT+RL arm: GSPO on RL prompts (never seen in SFT)
            grpo, best = rl_arm(lm, seed, p, pc, tcfg, val_fn, scorer, rec)
            torch.save(best["state"], out_dir / f"rl_s{seed}.pt")
            selected = {"sft_more_step": kept_step, "rl_step": best["step"]}
            t0 = tick("rl", t0)
            per_step = extra / pc.rl_steps
            for h in grpo.history:
                rl_hist.append(dict(h, seed=seed))
                if "val_reward" in h:
                    curves.append({"seed": seed, "arm": "rl", "compute": round(h["step"] * per_step, 3),
                                   "val_reward": h["val_reward"], "val_exec": h["val_exec"]})
    return {"kind": "program", "seed": seed, "sft_history": sft_hist, "rl_history": rl_hist, "curves": curves,
            "selected": selected, "kernels": {k: v["calls"] for k, v in rec.to_dict().items()}, "cpu": cpu}


def _run(cfg: Config, ctx: StageContext, prep, meta, device, sandbox, phases: dict[str, float],
         pooled_sandbox: dict[str, float]) -> None:
    seeds = meta["seeds"]
    g, pc = cfg.ground, cfg.program
    data = run_inputs(cfg, prep, ctx.out, device)
    pseeds = seeds[: pc.n_seeds]
    rec = KernelRecord(device)

    # ---- independent runs in a pool of single-threaded processes (stages.common.jobs): per seed (1) BRepGround-mini
    #      with its validation curve and calibration table, (2) the program model: SFT (its checkpoint) → SFT-only
    #      (equal compute) | SFT+RL (GSPO). Each run seeds itself from its seed alone. The program runs' sandbox
    #      grounds with the first seed's grounder: that one (and the next, one per pool process) runs first; then
    #      the program runs (the longest at default: ~65 s against ~55 s of a grounder), then the other grounders.
    #      One pool for all of them (each pool process imports torch and Lightning once): a program run waits until
    #      the first grounder's checkpoint is written (wait_for_env_grounder); that grounder is the first job.
    results = run_jobs(train_run, job_order(seeds, pseeds, cfg.workers, bool(pc.rl_steps)), data, cfg.workers)
    done = {(r["kind"], r["seed"]): r for r in results}
    for r in results:
        for k, v in r["cpu"].items():
            phases[k] = phases.get(k, 0.0) + v
        for k, v in r.get("sandbox", {}).items():
            key = {"requested": "scripts_requested", "executed": "scripts_executed",
                   "wait_wall": "sandbox_wait_wall"}.get(k, k)
            pooled_sandbox[key] = pooled_sandbox.get(key, 0) + v

    # ---- the rows, in seed order as before (W&B: one curve per seed and phase)
    ground_hist, ground_curve, calib = [], [], []
    for seed in seeds:
        r = done[("ground", seed)]
        ground_hist += r["history"]
        ground_curve += r["curve"]
        calib += r["calibration"]
        for h in r["history"] if ctx.tracker is not None else ():
            ctx.tracker.log({"ground/step": h["step"], f"ground/seed{seed}/loss": h["loss"]})
    pl.DataFrame(ground_hist).write_csv(ctx.out / "ground_history.csv")
    pl.DataFrame(ground_curve).write_csv(ctx.out / "ground_curve.csv")
    pl.DataFrame(calib).write_csv(ctx.out / "calibration.csv")

    sft_hist, rl_hist, curves, selected = [], [], [], {}
    for seed in pseeds:
        r = done[("program", seed)]
        sft_hist += r["sft_history"]
        rl_hist += r["rl_history"]
        curves += r["curves"]
        if r["selected"] is not None:
            selected[str(seed)] = r["selected"]
        for name, calls in r["kernels"].items():
            rec.count(name, calls)
        for h in r["sft_history"] if ctx.tracker is not None else ():
            ctx.tracker.log({"sft/step": h["step"], f"sft/seed{seed}/{h['phase']}/loss": h["loss"]})
        for h in r["rl_history"] if ctx.tracker is not None else ():
            ctx.tracker.log({"grpo/step": h["step"], **{f"grpo/seed{seed}/{k}": v for k, v in h.items()
                                                         if k not in ("step", "seed")}})

    mcfg = TinyTransformerConfig(**data["model"])
    rows = data["rows"]
    if pc.rl_steps:
        x = data["points"][:4].to(device)
        rec.parity("chamfer", chamfer_distance, x[:, :67], x.flip(0)[:, :45],
                   slice="surface points of 4 program targets (67 vs 45 points, odd tile edges)")
        lm = TinyTransformer(mcfg)
        lm.load_state_dict(torch.load(ctx.out / f"sft_s{pseeds[-1]}.pt", map_location="cpu", weights_only=True))
        lm = lm.to(device).eval()
        with torch.no_grad():
            lg = lm(rows[:8, :-1].to(device))[:, pc.prompt_len - 1:]
            rec.parity("token_logprob", token_logprob, lg.contiguous(), rows[:8, pc.prompt_len:].to(device),
                       slice="last SFT model's logits on 8 SFT programs")
    rec.save(ctx.out)
    pl.DataFrame(sft_hist).write_csv(ctx.out / "sft_history.csv")
    if rl_hist:
        pl.DataFrame(rl_hist, infer_schema_length=None).write_csv(ctx.out / "rl_history.csv")
        pl.DataFrame(curves, infer_schema_length=None).write_csv(ctx.out / "program_curves.csv")
    executed = sandbox.executed if sandbox else int(pooled_sandbox.get("scripts_executed", 0))
    crashes = sandbox.crashes if sandbox else int(pooled_sandbox.get("crashes", 0))
    write_json(ctx.out / "models.json", {
        "seeds": seeds, "ground": g.model_dump(mode="json"), "program": pc.model_dump(mode="json"),
        "program_vocab": data["pvocab_list"], "model": mcfg.__dict__, "n_train_queries": data["n_train_queries"],
        "n_val_queries": len(data["val_rows"]), "n_programs": data["n_programs"],
        "equal_compute_sft_steps": data["equal_compute_sft_steps"], "env_grounder": f"ground_s{seeds[0]}.pt",
        "program_seeds": pseeds, "selected_checkpoints": selected,
        "sandbox": {"workers": cfg.sandbox_workers if sandbox else data["sandbox_workers"],   # pooled: per program run
                    "executed": executed, "crashes": crashes},
        "cli_checkpoint": f"ground_s{seeds[0]}.pt"})
