"""TG-DT: text encoder, trajectory encoder, dual alignment, decision transformer with cross-attention.

    model = TGDT(arm="tgdt", obs_dim=4, act_dim=2, n_tasks=24, task_dim=2, vocab_size=20, ...)
    model.attach(data)                        # tensors from stages/tgdt/train.load_env (train tasks only)
    trainer.fit(model, DataLoader(range(steps), batch_size=None))
    a = model.act(rtg, obs, act, tsteps, pad, cond)      # (B, K, act_dim) at evaluation

Arms (``arm``) differ only in what the decision transformer cross-attends to (the "memory"):
    tgdt          text-encoder token states of the task description, + InfoNCE + matching losses
    tgdt_noalign  same, trained with the DT loss only (alignment ablation)
    dt            one learned constant token (no task information)
    onehot        an embedding of the task id (held-out ids are never trained)
    oracle_id     the one-hot model trained on ALL tasks' data, held-out tasks included (the upper
                  bound of what a task-conditioned DT of this size reaches on the held-out tasks)
    oracle        an MLP of the true task vector (target velocity)
    tgdt_share    TG-DT fine-tuned with description-guided data sharing (``share_with``): half of each
                  batch pairs a held-out description with windows of training tasks drawn ∝ softmax of
                  text-embedding similarity (top-k), the other half as in TG-DT

Losses (tgdt): L = MSE(â, a) + λ_nce L_TBC + λ_itm L_TBM, where
    # ALGO: TBC — symmetric InfoNCE between L2-normalised text CLS and trajectory CLS projections,
    #        logits s·cos, s = exp(learnable log-scale, init 2.659); kernels/fused_infonce.py
    # ALGO: TBM — binary matching head on the trajectory CLS after cross-attending to the text;
    #        positives = own description, negatives = a mismatched description drawn ∝ softmax(sim)
    # ALGO: DT  — tokens (R̂_t, s_t, a_t) interleaved, causal self-attention + cross-attention to the
    #        memory, action predicted from the s_t token through tanh; MSE on the main batch
"""
from __future__ import annotations

import math

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F

from kernels.fused_infonce import fused_infonce

ARMS = ("tgdt", "tgdt_noalign", "dt", "onehot", "oracle_id", "oracle", "tgdt_share")
ID_ARMS = ("onehot", "oracle_id")
TEXT_ARMS = ("tgdt", "tgdt_noalign", "tgdt_share")


def _encoder(d, heads, layers):
    layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


class TGDT(L.LightningModule):
    def __init__(self, arm: str, obs_dim: int, act_dim: int, n_tasks: int, task_dim: int, vocab_size: int,
                 text_len: int, context: int, seg_len: int, max_steps: int, d_model: int = 64, n_layers: int = 2,
                 n_heads: int = 4, proj_dim: int = 32, lr: float = 1e-3, weight_decay: float = 1e-4,
                 batch_size: int = 64, nce_weight: float = 1.0, itm_weight: float = 1.0, seed: int = 0):
        super().__init__()
        if arm not in ARMS:
            raise ValueError(f"arm: unknown arm {arm!r} (known: {', '.join(ARMS)})")
        if context <= 0:
            raise ValueError(f"context: must be a positive number of timesteps (got {context})")
        # explicit (not frame inspection, which a wrapped __init__, e.g. under mutmut, defeats)
        self.save_hyperparameters(dict(
            arm=arm, obs_dim=obs_dim, act_dim=act_dim, n_tasks=n_tasks, task_dim=task_dim, vocab_size=vocab_size,
            text_len=text_len, context=context, seg_len=seg_len, max_steps=max_steps, d_model=d_model,
            n_layers=n_layers, n_heads=n_heads, proj_dim=proj_dim, lr=lr, weight_decay=weight_decay,
            batch_size=batch_size, nce_weight=nce_weight, itm_weight=itm_weight, seed=seed))
        d = d_model
        # --- trajectory token embeddings (shared by the DT and the trajectory encoder)
        self.embed_s, self.embed_a, self.embed_r = nn.Linear(obs_dim, d), nn.Linear(act_dim, d), nn.Linear(1, d)
        self.embed_t = nn.Embedding(max_steps + 1, d)
        self.pad_tok = nn.Parameter(torch.zeros(d))
        self.ln_in = nn.LayerNorm(d)
        dec = nn.TransformerDecoderLayer(d, n_heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.dt = nn.TransformerDecoder(dec, n_layers)
        self.head = nn.Linear(d, act_dim)
        # --- conditioning
        if arm in TEXT_ARMS:
            self.tok = nn.Embedding(vocab_size, d, padding_idx=0)
            self.tpos = nn.Parameter(0.02 * torch.randn(text_len + 1, d))
            self.text_enc = _encoder(d, n_heads, 2)
            self.text_proj = nn.Linear(d, proj_dim)
            self.traj_cls = nn.Parameter(0.02 * torch.randn(d))
            self.traj_pos = nn.Parameter(0.02 * torch.randn(seg_len + 1, d))
            self.traj_enc = _encoder(d, n_heads, 1)
            self.traj_proj = nn.Linear(d, proj_dim)
            self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))   # 2.659, as officially
            fuse = nn.TransformerDecoderLayer(d, n_heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
            self.match_fuse = nn.TransformerDecoder(fuse, 1)
            self.match_head = nn.Linear(d, 1)
        elif arm == "dt":
            self.null = nn.Parameter(0.02 * torch.randn(1, 1, d))
        elif arm in ID_ARMS:
            self.task_emb = nn.Embedding(n_tasks, d)
        elif arm == "oracle":
            self.task_mlp = nn.Sequential(nn.Linear(task_dim, d), nn.GELU(), nn.Linear(d, d))
        self.kernel_backend = "torch"
        self.kernel_calls = 0
        self.data = None
        self.share = None            # description-guided data sharing: (held-out task ids, (U, J) weights)
        self.history: list[dict] = []
        self.step_offset = 0        # a resumed run (``resume``) numbers its steps from here
        self.resume: dict | None = None   # {"optimizer": AdamW state, "gen": generator state} to resume from

    # ------------------------------------------------------------------ encoders
    def encode_text(self, ids: torch.Tensor):
        """ids (B, L+1) with [CLS] first -> token states (B, L+1, d), pad mask (B, L+1)."""
        pad = ids == 0
        h = self.text_enc(self.tok(ids) + self.tpos[: ids.shape[1]], src_key_padding_mask=pad)
        return h, pad

    def text_embedding(self, ids):
        h, _ = self.encode_text(ids)
        return F.normalize(self.text_proj(h[:, 0]), dim=-1)              # (B, p) CLS projection

    def encode_traj(self, obs, act):
        """obs (B, L, ds), act (B, L, da) -> token states (B, L+1, d) with a CLS token first."""
        B, Lg, _ = obs.shape
        x = self.embed_s(obs) + self.embed_a(act)
        x = torch.cat([self.traj_cls.expand(B, 1, -1), x], 1) + self.traj_pos[: Lg + 1]
        return self.traj_enc(x)

    def traj_embedding(self, obs, act):
        return F.normalize(self.traj_proj(self.encode_traj(obs, act)[:, 0]), dim=-1)

    def memory(self, cond: dict):
        """What the DT cross-attends to, per arm: (B, M, d) and a key-padding mask (B, M)."""
        arm = self.hparams.arm
        if arm in TEXT_ARMS:
            return self.encode_text(cond["text"])
        B = cond["task"].shape[0]
        if arm == "dt":
            mem = self.null.expand(B, 1, -1)
        elif arm in ID_ARMS:
            mem = self.task_emb(cond["task"])[:, None]
        else:
            mem = self.task_mlp(cond["vector"])[:, None]
        return mem, torch.zeros(B, 1, dtype=torch.bool, device=mem.device)

    # ------------------------------------------------------------------ decision transformer
    def act(self, rtg, obs, act, tsteps, pad, cond, memory=None, last_only: bool = False):
        """rtg (B, K), obs (B, K, ds), act (B, K, da), tsteps (B, K), pad (B, K) -> â (B, K, da), or
        (B, 1, da) for the last timestep only with ``last_only`` (evaluation).
        ``memory``: a precomputed ``self.memory(cond)`` (evaluation reuses it across timesteps)."""
        B, K, _ = obs.shape
        te = self.embed_t(tsteps)
        tok = torch.stack([self.embed_r(rtg[..., None]) + te, self.embed_s(obs) + te, self.embed_a(act) + te], 2)
        tok = torch.where(pad[:, :, None, None], self.pad_tok, tok).reshape(B, 3 * K, -1)   # (B, 3K, d)
        mem, mem_pad = self.memory(cond) if memory is None else memory
        rows = slice(3 * K - 2, 3 * K - 1) if last_only else slice(1, None, 3)      # the s_t tokens
        h = self.decode(self.ln_in(tok), mem, mem_pad, rows)
        return torch.tanh(self.head(h))                                # predicted from the s_t tokens

    def decode(self, x, mem, mem_pad, rows: slice):
        """``self.dt(x, mem, causal mask)[:, rows]``, computed as such: every layer but the last runs
        whole; the last one runs its queries, cross-attention and MLP on ``rows`` only (the outputs
        at the other positions are never used; keys and values still span every token). Arms whose
        memory is one unpadded token (no-info, id, vector) skip the cross-attention's scores: a softmax
        over a single key is exactly 1, so every query receives that key's projected value."""
        causal = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        one_key = self.hparams.arm not in TEXT_ARMS
        *body, last = self.dt.layers
        for layer in body:
            if not one_key:
                x = layer(x, mem, tgt_mask=causal, tgt_is_causal=True, memory_key_padding_mask=mem_pad)
                continue
            h = layer.norm1(x)                                          # norm_first layer, as in its forward
            x = x + layer.dropout1(layer.self_attn(h, h, h, attn_mask=causal, is_causal=True, need_weights=False)[0])
            x = x + layer.dropout2(_one_key_value(layer.multihead_attn, mem))
            x = x + layer._ff_block(layer.norm3(x))
        h = last.norm1(x)
        y = x[:, rows] + last.dropout1(last.self_attn(h[:, rows], h, h, attn_mask=causal[rows],
                                                      need_weights=False)[0])
        if one_key:
            y = y + last.dropout2(_one_key_value(last.multihead_attn, mem))
        else:
            y = y + last._mha_block(last.norm2(y), mem, None, mem_pad)
        return y + last._ff_block(last.norm3(y))

    # ------------------------------------------------------------------ training
    def attach(self, data: dict) -> None:
        self.data = data

    def on_fit_start(self):
        self.data = prepare_data(self.data, self.device)
        self.gen = torch.Generator(device=self.device).manual_seed(int(self.hparams.seed) + 12345)
        if self.resume is not None:
            self.gen.set_state(self.resume["gen"])

    @torch.no_grad()
    def share_with(self, top_k: int = 3) -> None:
        """ALGO: description-guided data sharing — weights w_uj ∝ exp(s·cos(text_u, text_j)) over the
        top-k training tasks j for every held-out description u (template 0 embeddings)."""
        D = self.data
        held = torch.tensor([t for t in range(D["text"].shape[0]) if t not in set(D["train_tasks"].tolist())])
        e = self.text_embedding(D["text"][:, 0].to(self.device))
        sim = self.logit_scale.exp().clamp(max=100.0) * e[held.to(self.device)] @ e[D["train_tasks"].to(self.device)].T
        kth = sim.topk(min(top_k, sim.shape[1]), dim=1).values[:, -1:]
        w = torch.where(sim >= kth, sim, torch.full_like(sim, -float("inf"))).softmax(-1)
        self.share = (held, w.cpu())

    def sample_windows(self, n: int):
        """n random context windows (left-padded near the episode start) from training episodes."""
        return sample_windows(self.data, self.hparams.context, n, self.gen, self.share)

    def draw_alignment(self) -> dict:
        return draw_alignment(self.data, self.hparams.seg_len, self.gen)

    def alignment_losses(self, draw: dict | None = None):
        """TBC (InfoNCE through the fused kernel) + TBM (matching with mismatched-text negatives).
        ``draw``: the step's random inputs (``draw_alignment``); drawn from ``self.gen`` when None."""
        draw = self.draw_alignment() if draw is None else draw
        obs, act, text = draw["obs"], draw["act"], draw["text"]
        n = text.shape[0]
        th_pos, tpad_pos = self.encode_text(text)                          # each encoder runs once per step
        traj_tok = self.encode_traj(obs, act)
        t_emb = F.normalize(self.text_proj(th_pos[:, 0]), dim=-1)
        z_emb = F.normalize(self.traj_proj(traj_tok[:, 0]), dim=-1)
        scale = self.logit_scale.exp().clamp(max=100.0)
        out = fused_infonce(t_emb, z_emb, scale, backend=self.kernel_backend)  # ALGO: TBC, (CE_row + CE_col)/2
        self.kernel_calls += 1
        # ALGO: TBM — hard mismatched text for each trajectory, drawn ∝ softmax of its similarities
        # (Gumbel-max with noise drawn beforehand: an exact softmax sample, and vmappable over seeds)
        with torch.no_grad():
            neg = gumbel_negatives(scale * z_emb @ t_emb.T, draw["gumbel"])
        # the mismatched description's token states = those of its own row (deterministic encoder)
        th, tpad = torch.cat([th_pos, th_pos[neg]]), torch.cat([tpad_pos, tpad_pos[neg]])
        fused = self.match_fuse(torch.cat([traj_tok, traj_tok]), th, memory_key_padding_mask=tpad)
        logit = self.match_head(fused[:, 0]).squeeze(-1)
        label = torch.cat([torch.ones(n, device=logit.device), torch.zeros(n, device=logit.device)])
        itm = F.binary_cross_entropy_with_logits(logit, label)
        return out[0], itm

    def val_mse_tensor(self, v: dict) -> torch.Tensor:
        """Masked action MSE on windows ``v`` (a 0-d tensor; vmappable over seeds)."""
        pred = self.act(v["rtg"], v["obs"], v["act"], v["tsteps"], v["pad"], v["cond"])
        keep = (~v["pad"]).float()[..., None]
        return ((pred - v["act"]) ** 2 * keep).sum() / (keep.sum() * v["act"].shape[-1])

    @torch.no_grad()
    def val_mse(self) -> float:
        """Action MSE on the fixed validation windows (training tasks' held-back expert episodes, never
        trained on; ``data["val"]``), conditioned as at test: the learning curve that fixes ``steps``."""
        v = self.data.get("val")
        if v is None:
            return float("nan")
        was = self.training
        self.eval()
        out = float(self.val_mse_tensor(v))
        self.train(was)
        return out

    def draw_step(self) -> dict:
        """Every random input of one training step, drawn from ``self.gen`` (windows, then alignment)."""
        rtg, obs, act, tsteps, pad, cond = self.sample_windows(self.hparams.batch_size)
        step = {"rtg": rtg, "obs": obs, "act": act, "tsteps": tsteps, "pad": pad, "cond": cond}
        if self.hparams.arm in ALIGN_ARMS:
            step["align"] = self.draw_alignment()
        return step

    def step_losses(self, step: dict) -> dict:
        """The training losses of one step from its drawn inputs (a pure function of the parameters:
        the seed ensemble vmaps it). {"loss", "mse"[, "nce", "itm"]} as 0-d tensors."""
        rtg, obs, act, pad = step["rtg"], step["obs"], step["act"], step["pad"]
        pred = self.act(rtg, obs, act, step["tsteps"], pad, step["cond"])
        keep = (~pad).float()[..., None]
        mse = ((pred - act) ** 2 * keep).sum() / (keep.sum() * act.shape[-1])     # ALGO: DT action MSE
        out = {"loss": mse, "mse": mse}
        if "align" in step:
            nce, itm = self.alignment_losses(step["align"])
            out["loss"] = mse + self.hparams.nce_weight * nce + self.hparams.itm_weight * itm   # 1:1:1 officially
            out.update(nce=nce, itm=itm)
        return out

    def training_step(self, batch, batch_idx):
        out = self.step_losses(self.draw_step())
        i = batch_idx + self.step_offset
        if is_curve_step(i, self.trainer.max_steps + self.step_offset):     # learning curve for the report
            logs = {k: v.detach() for k, v in out.items() if k != "loss"}
            self.log_dict(logs, prog_bar=True)                           # logged at the curve's steps only
            self.history.append({"step": int(i), **{k: float(v) for k, v in logs.items()},
                                 "val_mse": self.val_mse()})
        return out["loss"]

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay,
                                foreach=True)
        if self.resume is not None:
            opt.load_state_dict(self.resume["optimizer"])
        return opt


ALIGN_ARMS = ("tgdt", "tgdt_share")
CURVE_EVERY = 20


def is_curve_step(batch_idx: int, max_steps: int) -> bool:
    return batch_idx % CURVE_EVERY == 0 or batch_idx == max_steps - 1


def _one_key_value(attn: nn.MultiheadAttention, mem: torch.Tensor) -> torch.Tensor:
    """Multi-head attention of any queries over the single key/value token ``mem`` (B, 1, d): the
    softmax weight is 1, so the output is out_proj(v_proj(mem)), (B, 1, d), for every query."""
    d = mem.shape[-1]
    v = F.linear(mem, attn.in_proj_weight[2 * d:], attn.in_proj_bias[2 * d:])
    return attn.out_proj(v)


def gumbel_negatives(sim: torch.Tensor, gumbel: torch.Tensor) -> torch.Tensor:
    """Row i's negative j ≠ i drawn ∝ softmax_j(sim_ij) by Gumbel-max (``gumbel`` = −log(−log U))."""
    eye = torch.eye(sim.shape[-1], dtype=torch.bool, device=sim.device)
    return (sim.masked_fill(eye, -float("inf")) + gumbel).argmax(-1)


def prepare_data(data: dict, device) -> dict:
    """``data`` moved to ``device``, with the per-task episode lists as padded (n_tasks, max) matrices
    + counts (vectorised sampling)."""
    def to(x):
        return x.to(device) if torch.is_tensor(x) else {i: to(t) for i, t in x.items()}
    data = {k: to(v) for k, v in data.items()}
    for key in ("expert_eps", "task_eps"):
        lists = [data[key][t] for t in range(len(data[key]))]
        width = max(1, max(len(v) for v in lists))
        mat = torch.zeros(len(lists), width, dtype=torch.long, device=device)
        for t, v in enumerate(lists):
            mat[t, : len(v)] = v
        data[key + "_mat"] = mat
        data[key + "_cnt"] = torch.tensor([max(1, len(v)) for v in lists], device=device)
    return data


def sample_windows(D: dict, K: int, n: int, gen: torch.Generator, share=None):
    """n random context windows of length K (left-padded near the episode start) from D["train_eps"],
    drawn from ``gen``; ``share``: (held-out ids, (U, J) weights) for the data-sharing second half."""
    dev = D["obs"].device
    N, T = D["obs"].shape[:2]
    ep = D["train_eps"][torch.randint(len(D["train_eps"]), (n,), generator=gen, device=dev)]
    shared = None
    if share is not None:                   # second half: held-out description on shared data
        held, w = share[0].to(dev), share[1].to(dev)
        m = n // 2
        u = torch.randint(len(held), (m,), generator=gen, device=dev)
        j = D["train_tasks"][torch.multinomial(w[u], 1, generator=gen).squeeze(1)]
        pick = torch.randint(10**9, (m,), generator=gen, device=dev)
        ep[n - m:] = D["task_eps_mat"][j, pick % D["task_eps_cnt"][j]]
        shared = (n - m, held[u])
    end = torch.randint(1, T + 1, (n,), generator=gen, device=dev)     # window = [end-K, end)
    idx = end[:, None] - K + torch.arange(K, device=dev)[None]
    pad = idx < 0
    idx = idx.clamp_min(0)
    obs = D["obs"][ep[:, None], idx]
    act = D["act"][ep[:, None], idx]
    rtg = D["rtg"][ep[:, None], idx]
    task = D["task"][ep]
    tmpl = torch.randint(D["text"].shape[1], (n,), generator=gen, device=dev)
    text_task = task.clone()
    if shared is not None:
        text_task[shared[0]:] = shared[1]
    cond = {"task": task, "vector": D["vector"][task], "text": D["text"][text_task, tmpl]}
    return rtg, obs, act, idx, pad, cond


def draw_alignment(D: dict, Lg: int, gen: torch.Generator) -> dict:
    """One (expert segment of length Lg, description) pair per training task + the Gumbel noise of the
    matching negatives, drawn from ``gen``."""
    dev = D["obs"].device
    tasks = D["train_tasks"]                                           # one pair per training task
    n, T = len(tasks), D["obs"].shape[1]
    pick = torch.randint(10**9, (n,), generator=gen, device=dev)
    ep = D["expert_eps_mat"][tasks, pick % D["expert_eps_cnt"][tasks]]
    start = torch.randint(0, T - Lg + 1, (n,), generator=gen, device=dev)
    idx = start[:, None] + torch.arange(Lg, device=dev)[None]
    tmpl = torch.randint(D["text"].shape[1], (n,), generator=gen, device=dev)
    u = torch.rand((n, n), generator=gen, device=dev).clamp(1e-12, 1 - 1e-7)
    return {"obs": D["obs"][ep[:, None], idx], "act": D["act"][ep[:, None], idx],
            "text": D["text"][tasks, tmpl], "gumbel": -torch.log(-torch.log(u))}
