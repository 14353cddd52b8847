"""train: per seed, (1) BRepGround-mini on seen-template queries of the training parts (BCE over
primitives); (2) the program model: SFT of a prefix-LM (description → CadQuery-like script whose
fillet/chamfer step carries a query), then GRPO through the shared trainer ``stages.common.grpo`` with

    # ALGO: reward r = executes(script) × (1 − min(1, CD(script solid, target solid) / diag(target)))

Scripts are run by the sandboxed interpreter (``cad.run_script``: whitelisted calls only), their
Query(...) operands grounded by this seed's BRepGround-mini; CD goes through kernels/chamfer.

    python -m stages train futurecad [--profile smoke]
"""
from __future__ import annotations

import copy
import json

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
from stages.common.paths import read_json, write_json
from stages.common.runner import StageContext
from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig
from stages.common.trainer import TrainerConfig, make_trainer
from stages.futurecad import cad
from stages.futurecad.model import (BRepGround, GroundLoader, GroundModule, RowLoader, ScriptPolicy, SFTModule,
                                    build_program_vocab, build_vocab, decode_script, encode_prompt, encode_query,
                                    encode_script, label_matrix, pad_parts, predict)
from stages.futurecad.prepare import oracle_grounder


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
    lr: float = Field(2e-3, gt=0, le=1.0)

    @model_validator(mode="after")
    def _heads(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"ground.n_heads: {self.n_heads} must divide d_model {self.d_model}")
        return self


class ProgramConfig(StageConfig):
    d_model: int = Field(64, ge=8, le=1024)
    n_layers: int = Field(2, ge=1, le=24)
    n_heads: int = Field(4, ge=1, le=32)
    prompt_len: int = Field(48, ge=8, le=512, description="description tokens (left-padded, ends in BOS)")
    script_len: int = Field(112, ge=16, le=1024, description="script tokens incl. EOS")
    sft_steps: PositiveInt = Field(250, le=100_000)
    sft_batch: PositiveInt = Field(32, le=4096)
    sft_lr: float = Field(3e-3, gt=0, le=1.0)
    rl_steps: int = Field(15, ge=0, le=10_000, description="GRPO steps (0: SFT only)")
    prompts_per_step: PositiveInt = Field(4, le=1024)
    rl_lr: float = Field(3e-4, gt=0, le=1.0)
    grpo: GRPOConfig = GRPOConfig(group_size=6, clip_eps=0.2, kl_coef=0.0, loss_norm="tokens", ppo_epochs=1,
                                  grad_clip=1.0)

    @model_validator(mode="after")
    def _heads(self):
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError(f"program.n_heads: {self.n_heads} must divide d_model {self.d_model} into even head dims")
        return self


class Config(StageConfig):
    torch_threads: int = Field(1, ge=1, le=64)
    device: DeviceName = "auto"
    ground: GroundConfig = GroundConfig()
    program: ProgramConfig = ProgramConfig()
    trainer: TrainerConfig = TrainerConfig(enable_progress_bar=False)


def load_parts(prep) -> list[dict]:
    return torch.load(prep / "primitives.pt", weights_only=True)


def query_tensors(rows: list[dict], vocab: dict[str, int], max_words: int) -> torch.Tensor:
    return torch.tensor([encode_query(r["query"], vocab, max_words) for r in rows], dtype=torch.long)


def load_ground(path, device="cpu") -> tuple[BRepGround, dict]:
    """The checkpoint the CLI and evaluate load: (model, meta with vocab and sizes)."""
    ck = torch.load(path, map_location=device, weights_only=True)
    meta = json.loads(ck["meta"])
    g = meta["ground"]
    net = BRepGround(len(meta["vocab"]), g["d_model"], g["n_heads"], g["text_layers"], g["fusion_layers"],
                     g["max_words"]).to(device)
    net.load_state_dict(ck["state"])
    return net.eval(), meta


class ModelGrounder:
    """cad.Grounder backed by BRepGround-mini: (solid, query) -> edge ids with σ(score) > ½."""

    def __init__(self, net: BRepGround, meta: dict):
        self.net, self.meta = net, meta
        self.vocab = {w: i for i, w in enumerate(meta["vocab"])}
        self.calls = 0

    def scores(self, prims: cad.Primitives, query: str) -> tuple[np.ndarray, np.ndarray]:
        g = self.meta["ground"]
        dev = next(self.net.parameters()).device
        parts = pad_parts([_prim_dict(prims)], g["max_faces"], g["max_edges"])
        words = torch.tensor([encode_query(query, self.vocab, g["max_words"])], dtype=torch.long)
        scores, _ = predict(self.net, words.to(dev), {k: v.to(dev) for k, v in parts.items()})
        s = scores[0].cpu().numpy()
        self.calls += 1
        return s[: len(prims.face_attr)], s[g["max_faces"]: g["max_faces"] + len(prims.edge_attr)]

    def __call__(self, solid, query: str) -> list[int]:
        _, es = self.scores(cad.export_primitives(solid), query)
        return [int(i) for i in np.flatnonzero(es > 0.5)]


def _prim_dict(prims: cad.Primitives) -> dict:
    from stages.futurecad.prepare import prim_tensors

    return prim_tensors(prims)


_WORKER: dict = {}


def _worker_init(grounder, n_points: int) -> None:
    torch.set_num_threads(1)
    _WORKER.update(grounder=grounder, n_points=n_points)


def _worker_execute(text: str):
    """Runs in the sandbox process: script -> (BREP bytes, surface points) or an error string."""
    import io

    try:
        solid = cad.run_script(text, _WORKER["grounder"]).solid
        pts = cad.surface_points(solid, _WORKER["n_points"])
        buf = io.BytesIO()
        solid.exportBrep(buf)
        return buf.getvalue(), pts
    except cad.ScriptError as err:
        return str(err)
    except Exception as err:  # anything else the kernel throws is a failed script, not a failed run
        return f"execution failed: {type(err).__name__}"


class ScriptScorer:
    """Executes scripts (cached by text) and scores them against program targets with the Chamfer kernel.

    Execution happens in a worker process (the sandbox): a script that makes the CAD kernel
    crash (a native segfault cannot be caught in-process) kills only the worker; it is recorded as a
    failure with reward 0 and a fresh worker takes the next script. ``sandbox=False`` runs in-process.
    """

    def __init__(self, grounder, targets: dict[int, dict], n_points: int, rec: KernelRecord, device,
                 sandbox: bool = True):
        self.grounder, self.targets, self.n_points, self.rec, self.device = grounder, targets, n_points, rec, device
        self.cache: dict[str, object] = {}
        self.sandbox = sandbox
        self.pool = None
        self.crashes = 0

    def _pool(self):
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        if self.pool is None:   # spawn (not fork): a forked child of a torch/OCC process can deadlock
            self.pool = ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn"),
                                            initializer=_worker_init, initargs=(self.grounder, self.n_points))
        return self.pool

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None

    def execute(self, text: str):
        import io
        from concurrent.futures.process import BrokenProcessPool

        if text not in self.cache:
            if self.sandbox:
                try:
                    out = self._pool().submit(_worker_execute, text).result()
                except BrokenProcessPool:
                    self.pool = None
                    self.crashes += 1
                    out = "CAD kernel crashed (sandbox worker died)"
            else:
                _WORKER.update(grounder=self.grounder, n_points=self.n_points)
                out = _worker_execute(text)
            if isinstance(out, str):
                self.cache[text] = out
            else:
                import cadquery as cq

                self.cache[text] = (cq.Shape.importBrep(io.BytesIO(out[0])), out[1])
        return self.cache[text]

    def score(self, texts: list[str], rids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(rewards, normalised CD) per script; failures: reward 0, CD 1."""
        res = [self.execute(t) for t in texts]
        ok = [i for i, r in enumerate(res) if not isinstance(r, str)]
        reward = torch.zeros(len(texts))
        ncd = torch.ones(len(texts))
        if ok:
            x = torch.from_numpy(np.stack([res[i][1] for i in ok])).to(self.device)
            y = torch.from_numpy(np.stack([self.targets[rids[i]]["points"] for i in ok])).to(self.device)
            cd = self.rec.call("chamfer", chamfer_distance, x, y).cpu()
            diag = torch.tensor([self.targets[rids[i]]["diag"] for i in ok])
            n = torch.clamp(cd / diag, max=1.0)                            # ALGO: normalised Chamfer distance
            ncd[ok] = n
            reward[ok] = 1.0 - n                                           # ALGO: executes × (1 − nCD)
        return reward, ncd


def program_targets(programs: list[dict], n_points: int) -> dict[int, dict]:
    out = {}
    for i, p in enumerate(programs):
        solid = cad.run_script(p["script"], oracle_grounder).solid
        out[i] = {"points": cad.surface_points(solid, n_points), "diag": p["diag"], "solid": solid}
    return out


def run(cfg: Config, ctx: StageContext) -> None:
    torch.set_num_threads(cfg.torch_threads)
    device = pick_device(cfg.device)
    prep = ctx.input("prepare")
    meta = read_json(prep / "meta.json")
    seeds = meta["seeds"]
    g = cfg.ground
    parts = load_parts(prep)
    q = pl.read_parquet(prep / "queries.parquet").filter(pl.col("split") == "train").to_dicts()
    vocab_list = build_vocab(r["query"] for r in q)
    vocab = {w: i for i, w in enumerate(vocab_list)}
    padded = pad_parts(parts, g.max_faces, g.max_edges)
    words = query_tensors(q, vocab, g.max_words)
    y = label_matrix(q, padded, g.max_faces, g.max_edges)
    part_idx = torch.tensor([r["part"] for r in q], dtype=torch.long)
    tcfg = cfg.trainer.model_copy(update={"accelerator": "gpu" if device.type == "cuda" else cfg.trainer.accelerator})
    ground_meta = {"vocab": vocab_list, "ground": g.model_dump(mode="json")}
    rec = KernelRecord(device)

    # program data
    pc = cfg.program
    progs = pl.read_parquet(prep / "programs.parquet").to_dicts()
    train_progs = [p for p in progs if p["split"] == "train"]
    pvocab_list = build_program_vocab([p["description"] for p in progs if p["split"] == "train"],
                                      [p["script"] for p in train_progs])
    pvocab = {t: i for i, t in enumerate(pvocab_list)}
    too_long = [p for p in train_progs if len(cad.script_tokens(p["script"])) + 1 > pc.script_len]
    if too_long:
        raise ValueError(f"program.script_len: {pc.script_len} is shorter than a training script "
                         f"({len(cad.script_tokens(too_long[0]['script'])) + 1} tokens)")
    rows = torch.tensor([encode_prompt(p["description"], pvocab, pc.prompt_len)
                         + encode_script(p["script"], pvocab, pc.script_len) for p in train_progs], dtype=torch.long)
    targets = program_targets(train_progs, meta["n_points"]) if pc.rl_steps else {}
    mcfg = TinyTransformerConfig(vocab_size=len(pvocab_list), d_model=pc.d_model, n_layers=pc.n_layers,
                                 n_heads=pc.n_heads, max_seq_len=pc.prompt_len + pc.script_len, causal=True)

    ground_hist, sft_hist, rl_hist = [], [], []
    for seed in seeds:
        # --- 1. BRepGround-mini
        torch.manual_seed(seed)
        net = BRepGround(len(vocab_list), g.d_model, g.n_heads, g.text_layers, g.fusion_layers, g.max_words)
        module = GroundModule(net, g.lr)
        make_trainer(tcfg, ctx.tracker, max_steps=g.steps).fit(
            module, GroundLoader(words, part_idx, y, padded, g.batch, g.steps, seed))
        net = net.to(device).eval()
        torch.save({"state": net.state_dict(), "meta": json.dumps(ground_meta)}, ctx.out / f"ground_s{seed}.pt")
        ground_hist += [dict(h, seed=seed) for h in module.history]

        # --- 2. program model: SFT
        torch.manual_seed(seed)
        lm = TinyTransformer(mcfg)
        sft = SFTModule(lm, pc.prompt_len, pc.sft_lr)
        make_trainer(tcfg, ctx.tracker, max_steps=pc.sft_steps).fit(sft, RowLoader(rows, pc.sft_batch, pc.sft_steps, seed))
        lm = lm.to(device).eval()
        torch.save(lm.state_dict(), ctx.out / f"sft_s{seed}.pt")
        sft_hist += [dict(h, seed=seed) for h in sft.history]

        # --- 3. GRPO from the SFT model, reward through the interpreter, this seed's grounder, Chamfer kernel
        if pc.rl_steps:
            scorer = ScriptScorer(ModelGrounder(net, ground_meta), targets, meta["n_points"], rec, device)

            def reward_fn(prompts, roll, _scorer=scorer):
                texts = [decode_script(r[pc.prompt_len:], pvocab_list) for r in roll["tokens"].tolist()]
                reward, _ = _scorer.score(texts, roll["rid"].tolist())
                return reward.to(roll["tokens"].device)

            def logprob_fn(logits, tgt):
                rec.count("token_logprob")
                return token_logprob(logits, tgt, backend=rec.backend)

            policy = ScriptPolicy(copy.deepcopy(lm), pc.prompt_len, pc.script_len, logprob_fn)
            grpo = GRPOModule(policy, reward_fn, pc.grpo, lr=pc.rl_lr, seed=seed)
            prompts = torch.cat([rows[:, : pc.prompt_len], torch.arange(len(rows))[:, None]], 1)
            make_trainer(tcfg, ctx.tracker, max_steps=pc.rl_steps).fit(
                grpo, PromptLoader(prompts, pc.prompts_per_step, pc.rl_steps, seed=seed))
            scorer.close()
            torch.save(policy.model.state_dict(), ctx.out / f"rl_s{seed}.pt")
            rl_hist += [dict(h, seed=seed, unique_scripts=len(scorer.cache), sandbox_crashes=scorer.crashes)
                        for h in grpo.history]

    if pc.rl_steps:
        x = torch.from_numpy(np.stack([targets[i]["points"] for i in range(min(4, len(targets)))])).to(device)
        rec.parity("chamfer", chamfer_distance, x[:, :67], x.flip(0)[:, :45],
                   slice="surface points of 4 training targets (67 vs 45 points, odd tile edges)")
        with torch.no_grad():
            lg = lm(rows[:8, :-1].to(device))[:, pc.prompt_len - 1:]
            rec.parity("token_logprob", token_logprob, lg.contiguous(), rows[:8, pc.prompt_len:].to(device),
                       slice="last SFT model's logits on 8 training programs")
    rec.save(ctx.out)
    pl.DataFrame(ground_hist).write_csv(ctx.out / "ground_history.csv")
    pl.DataFrame(sft_hist).write_csv(ctx.out / "sft_history.csv")
    if rl_hist:
        pl.DataFrame(rl_hist, infer_schema_length=None).write_csv(ctx.out / "rl_history.csv")
    write_json(ctx.out / "models.json", {"seeds": seeds, "ground": g.model_dump(mode="json"),
                                         "program": pc.model_dump(mode="json"), "program_vocab": pvocab_list,
                                         "model": mcfg.__dict__, "n_train_queries": len(q),
                                         "n_train_programs": len(train_progs), "cli_checkpoint": f"ground_s{seeds[0]}.pt"})
