"""evaluate@tgdt: zero-shot returns on seen and unseen tasks, text→trajectory retrieval, probes.

    python -m stages evaluate tgdt [--profile smoke]

For every (env, arm, seed): ``episodes`` rollouts per task (all tasks, training and held-out) with
the DT conditioned on the task's *description only* (TG-DT arms; template = episode index mod 4),
the task id (onehot), the true target velocity (oracle) or nothing (dt), from the fixed target
return-to-go R̂_0 = mean training-task expert return, R̂ ← R̂ − r / scale. Normalised return per
task = (R − R_random) / (R_expert − R_random) from prepare's reference returns.

Point-mass rollouts step a numpy ``PointMassBatch`` (equal to the gymnasium env, tests/tgdt); the
zero-action policy's normalised return on the same starts is kept as a reference (``zero_action``).

Retrieval (hot loop through kernels/fused_infonce.py via KernelRecord): for each TG-DT(-noalign)
seed and ``retrieval_rounds`` rounds, every task's description vs one expert segment of every task
(held-out tasks' trajectories included) → per-row top-1 hit (text → trajectory), split by seen /
unseen tasks; the mean cosine-similarity matrix of TG-DT's first seed is kept for the figure.
``probes``: extra descriptions embedded by TG-DT (nearest task reported); a word never seen in
training is warned about and listed under ``unknown_words``.
"""
from __future__ import annotations

import time
import warnings

import numpy as np
import torch
from pydantic import Field

from kernels.fused_infonce import fused_infonce, retrieval_hits
from kernels.record import KernelRecord
from stages.common.config import StageConfig
from stages.common.device import DeviceName, pick_device
from stages.common.paths import read_json, write_json
from stages.tgdt import envs as E
from stages.tgdt.model import TEXT_ARMS, TGDT
from stages.tgdt.train import load_env


class Config(StageConfig):
    device: DeviceName = "auto"
    seed: int = Field(0, ge=0, lt=2**32)
    episodes: int = Field(4, ge=1, le=1000)              # rollouts per task per (arm, seed)
    retrieval_rounds: int = Field(8, ge=1, le=1000)
    probes: list[str] = Field(default_factory=list, max_length=64)   # extra descriptions to embed


def load_model(path, device) -> TGDT:
    ck = torch.load(path, map_location=device, weights_only=False)
    model = TGDT(**ck["hparams"]).to(device)
    model.load_state_dict(ck["state_dict"])
    return model.eval()


class GymBatch:
    """A list of gymnasium envs behind PointMassBatch's interface (HalfCheetah: MuJoCo steps one by one)."""

    def __init__(self, tasks: list[E.Task], T: int):
        self.envs = [E.make_env(task, T) for task in tasks]
        self.alive = np.ones(len(tasks), dtype=bool)

    def reset(self, seeds):
        self.alive[:] = True
        return np.stack([env.reset(seed=int(s))[0] for env, s in zip(self.envs, seeds)])

    def step(self, actions):
        obs, rew = [], np.zeros(len(self.envs))
        for i, env in enumerate(self.envs):
            if self.alive[i]:
                o, rew[i], term, trunc, _ = env.step(actions[i])
                obs.append(o)
                self.alive[i] = not (term or trunc)
            else:
                obs.append(np.zeros(env.observation_space.shape, np.float32))
        return np.stack(obs), rew, ~self.alive

    def close(self):
        for env in self.envs:
            env.close()


def batch_env(tasks: list[E.Task], T: int):
    """Point mass: the numpy batch stepper (equal to the gymnasium env, tests/tgdt); else gym envs."""
    if all(t.env == "pointmass" for t in tasks):
        return E.PointMassBatch([t.vector for t in tasks], T)
    return GymBatch(tasks, T)


def episode_seed(seed: int, task: E.Task, e: int) -> int:
    return int(seed * 100_003 + 1000 * task.index + e)


def policy_rollout(policy, tasks: list[E.Task], meta: dict, episodes: int, seed: int) -> np.ndarray:
    """Raw returns (n_tasks, episodes) of a state-feedback policy(obs (n, ds), t) -> (n, da), same starts."""
    flat = [task for task in tasks for _ in range(episodes)]
    env = batch_env(flat, meta["max_steps"])
    obs = env.reset([episode_seed(seed, task, e) for task in tasks for e in range(episodes)])
    ret, alive = np.zeros(len(flat)), np.ones(len(flat), dtype=bool)
    for t in range(meta["max_steps"]):
        obs, r, done = env.step(policy(obs, t))
        ret += np.where(alive, r, 0.0)
        alive &= ~done
    getattr(env, "close", lambda: None)()
    return ret.reshape(len(tasks), episodes)


@torch.no_grad()
def rollout(model: TGDT, tasks: list[E.Task], data: dict, meta: dict, episodes: int, seed: int, device):
    """Batched rollouts of every task × episode; returns raw returns (n_tasks, episodes)."""
    K, T = model.hparams.context, meta["max_steps"]
    mean = torch.tensor(meta["obs_mean"], device=device)
    std = torch.tensor(meta["obs_std"], device=device)
    flat = [(task, e) for task in tasks for e in range(episodes)]
    n = len(flat)
    env = batch_env([task for task, _ in flat], T)
    obs0 = env.reset([episode_seed(seed, task, e) for task, e in flat])
    O = torch.zeros(n, T, meta["obs_dim"], device=device)
    A = torch.zeros(n, T, meta["act_dim"], device=device)
    Rh = torch.zeros(n, T, device=device)
    O[:, 0] = (torch.as_tensor(obs0, device=device) - mean) / std
    Rh[:, 0] = meta["target_return"] / meta["rtg_scale"]                 # fixed target return-to-go
    task_ids = torch.tensor([task.index for task, _ in flat], device=device)
    tmpl = torch.tensor([e % len(E.TEMPLATES) for _, e in flat], device=device)
    cond = {"task": task_ids, "vector": data["vector"].to(device)[task_ids],
            "text": data["text"].to(device)[task_ids, tmpl]}
    ret = np.zeros(n)
    alive = np.ones(n, dtype=bool)
    memory = model.memory(cond)                      # the condition is fixed for the whole episode
    for t in range(T):
        idx = t + 1 - K + torch.arange(K, device=device)
        pad = (idx < 0)[None].expand(n, K)
        idc = idx.clamp_min(0)
        a = model.act(Rh[:, idc], O[:, idc], A[:, idc], idc[None].expand(n, K), pad, cond, memory=memory,
                      last_only=True)[:, -1]
        A[:, t] = a
        o, r, done = env.step(a.cpu().numpy())
        r = np.where(alive, r, 0.0)
        ret += r
        if t + 1 < T and alive.any():                # one batched update of the stepped envs
            live = torch.as_tensor(alive, device=device)
            O[live, t + 1] = (torch.as_tensor(o[alive], device=device) - mean) / std
            Rh[live, t + 1] = Rh[live, t] - torch.as_tensor(r[alive] / meta["rtg_scale"], dtype=torch.float32,
                                                            device=device)
        alive &= ~done
    getattr(env, "close", lambda: None)()
    return ret.reshape(len(tasks), episodes)


@torch.no_grad()
def retrieval(model: TGDT, data: dict, rounds: int, rec: KernelRecord, seed: int, device, parity: bool, label: str):
    """Per-task top-1 text→trajectory hit rate (all tasks at once) and the mean cosine matrix."""
    Lg = model.hparams.seg_len
    n_tasks, n_tmpl = data["text"].shape[:2]
    T = data["obs"].shape[1]
    g = torch.Generator().manual_seed(seed)
    hits, sim = torch.zeros(n_tasks), torch.zeros(n_tasks, n_tasks)
    for r in range(rounds):
        ep = torch.stack([data["expert_eps"][t][r % len(data["expert_eps"][t])] for t in range(n_tasks)])
        start = torch.randint(0, T - Lg + 1, (n_tasks,), generator=g)
        idx = start[:, None] + torch.arange(Lg)[None]
        z = model.traj_embedding(data["obs"][ep[:, None], idx].to(device), data["act"][ep[:, None], idx].to(device))
        t = model.text_embedding(data["text"][torch.arange(n_tasks), r % n_tmpl].to(device))
        s = model.logit_scale.exp().clamp(max=100.0)
        out = rec.call("fused_infonce", fused_infonce, t, z, s)
        if parity and r == 0:
            rec.parity("fused_infonce", fused_infonce, t, z, s,
                       slice=f"{label}: all {n_tasks} tasks' (description, expert segment) pairs, round 0")
        hits += retrieval_hits(out)[0].float().cpu()
        sim += (t @ z.T).cpu()
    return (hits / rounds).numpy(), (sim / rounds).numpy()


def run(cfg: Config, ctx) -> None:
    torch.set_num_threads(1)
    device = pick_device(cfg.device)
    rec = KernelRecord(device)
    prep, trained = ctx.input("prepare"), ctx.input("train")
    tcfg = read_json(trained / "train_summary.json")["config"]
    out: dict = {"envs": {}, "probes": [], "unknown_words": [], "episodes": cfg.episodes}
    parity_done = False
    env_names = read_json(prep / "summary.json")["envs"]
    probe_env = "pointmass" if "pointmass" in env_names else env_names[0]
    out["probe_env"] = probe_env
    for env in env_names:
        data, meta = load_env(prep / env, tcfg["text_len"], tcfg["context"])
        tasks = [E.Task(env, t["index"], t["direction"], t["speed"], tuple(t["vector"]), t["held_out"])
                 for t in meta["tasks"]]
        rand = np.array([t["ref_random"] for t in meta["tasks"]])
        expert = np.array([t["ref_expert"] for t in meta["tasks"]])
        denom = np.maximum(expert - rand, 0.1 * np.abs(rand) + 1e-3)   # guard: expert ≈ random (HalfCheetah slow)
        held = np.array([t.held_out for t in tasks])
        res: dict = {"arms": {}, "tasks": meta["tasks"], "retrieval": {}}
        # reference: the zero-action policy (no task information, stops moving) on the same starts, the
        # behaviour a no-info DT would reach by averaging over the tasks' actions
        zero = policy_rollout(lambda o, t: np.zeros((len(o), meta["act_dim"])), tasks, meta, cfg.episodes, cfg.seed)
        zn = (zero.mean(1) - rand) / denom
        res["zero_action"] = {"seen": float(zn[~held].mean()), "unseen": float(zn[held].mean())}
        for arm in tcfg["arms"]:
            per = {"seen": [], "unseen": [], "per_task": []}
            for seed in tcfg["seeds"]:
                model = load_model(trained / env / f"{arm}_s{seed}.pt", device)
                raw = rollout(model, tasks, data, meta, cfg.episodes, cfg.seed + seed, device)
                norm = (raw.mean(1) - rand) / denom                           # normalised return per task
                per["seen"].append(float(norm[~held].mean()))
                per["unseen"].append(float(norm[held].mean()))
                per["per_task"].append(norm.tolist())
                items = (raw - rand[:, None]) / denom[:, None]                 # per (task, episode), paired across arms
                per.setdefault("unseen_items", []).append(items[held].ravel().tolist())
                per.setdefault("seen_items", []).append(items[~held].ravel().tolist())
                if arm in TEXT_ARMS:
                    hit, sim = retrieval(model, data, cfg.retrieval_rounds, rec, cfg.seed + seed, device,
                                         parity=not parity_done, label=f"{env}/{arm} seed {seed}")
                    parity_done = True
                    rr = res["retrieval"].setdefault(arm, {"seen": [], "unseen": [], "sim": None})
                    rr["seen"].append(float(hit[~held].mean()))
                    rr["unseen"].append(float(hit[held].mean()))
                    if rr["sim"] is None:
                        rr["sim"] = sim.tolist()
                    if arm == "tgdt" and seed == tcfg["seeds"][0] and env == probe_env:
                        out["probes"] += probe(model, data, meta, cfg.probes, tcfg["text_len"], device, env, out)
                print(f"evaluate@tgdt: {env} {arm} seed {seed}: seen {per['seen'][-1]:.3f} unseen {per['unseen'][-1]:.3f}")
            res["arms"][arm] = per
        res["chance_retrieval"] = 1.0 / len(tasks)
        out["envs"][env] = res
    rec.save(ctx.out)
    write_json(ctx.out / "eval.json", out)
    print(f"evaluate@tgdt: CPU time {time.process_time():.1f} s")


@torch.no_grad()
def probe(model, data, meta, probes, text_len, device, env, out) -> list[dict]:
    """Embed extra descriptions; warn about (and record) words never seen in training."""
    vocab = E.Vocab(meta["vocab"])
    tasks_emb = model.text_embedding(data["text"][:, 0].to(device))
    rows = []
    for i, text in enumerate(probes):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ids = vocab.encode(text, text_len, field=f"probes[{i}]")
        for w in caught:
            print(f"evaluate@tgdt: warning: {w.message}")
        unknown = vocab.unknown(text)
        out["unknown_words"] += [w for w in unknown if w not in out["unknown_words"]]
        e = model.text_embedding(torch.tensor([ids], device=device))
        j = int((e @ tasks_emb.T).argmax())
        t = meta["tasks"][j]
        rows.append({"env": env, "probe": text, "unknown_words": unknown,
                     "nearest_task": f"{t['direction']} {t['speed']}"})
    return rows
