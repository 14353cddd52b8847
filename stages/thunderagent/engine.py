"""A small real serving engine: the shared tiny GPT with a paged KV cache, replaying a scheduler trace.

The simulator (sim.py) run with ``trace=True`` records every engine operation its scheduler decided:
admit (with how many private / shared-prefix tokens were found cached), decode chunks of k
iterations over a batch, LRU trims of cache entries, preemptions. ``PagedEngine.replay`` executes that
trace with real tensors: a block pool per backend and layer, (N_blocks, BS, H, D); shared-prefix
blocks referenced by every program of the group; prefill of the missing tokens (dense attention over
the gathered cached prefix); batched greedy decode whose attention is kernels.paged_decode_attention
over the block tables. Every chunk is wall-clock timed with the simulator's cost features, so
``fit_cost_model`` can fit a, b, p, q. ``verify`` re-runs each program's final token sequence densely
(no cache) and counts generated tokens that differ from the dense greedy choice — any paging,
sharing, eviction or recompute bug shows up there.
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch
import torch.nn.functional as F

from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig, apply_rope
from stages.thunderagent.workload import Workload


class Pool:
    def __init__(self, n_blocks: int, bs: int, layers: int, H: int, D: int, device, dtype):
        self.bs = bs
        self.k = [torch.zeros(n_blocks, bs, H, D, device=device, dtype=dtype) for _ in range(layers)]
        self.v = [torch.zeros(n_blocks, bs, H, D, device=device, dtype=dtype) for _ in range(layers)]
        self.free = list(range(n_blocks - 1, -1, -1))
        self.n_blocks, self.peak = n_blocks, 0

    def alloc(self) -> int:
        if not self.free:
            raise RuntimeError("KV block pool exhausted: the scheduler admitted more than the capacity")
        b = self.free.pop()
        self.peak = max(self.peak, self.n_blocks - len(self.free))
        return b

    def resize(self, blocks: list[int], tokens: int) -> None:
        """Keep ceil(tokens / bs) blocks (tail blocks freed first)."""
        want = -(-tokens // self.bs)
        while len(blocks) > want:
            self.free.append(blocks.pop())
        while len(blocks) < want:
            blocks.append(self.alloc())


class PagedEngine:
    def __init__(self, wl: Workload, model_cfg: TinyTransformerConfig, seed: int, device, rec=None,
                 dtype=torch.float64):
        self.wl, self.device, self.rec, self.dtype = wl, device, rec, dtype
        torch.manual_seed(seed)
        self.model = TinyTransformer(model_cfg).to(device=device, dtype=dtype).eval()
        c = model_cfg
        self.H, self.D, self.L = c.n_heads, c.d_model // c.n_heads, c.n_layers
        bs = wl.cluster.block_size
        n_blocks = wl.cluster.kv_capacity_tokens // bs + 2 * (len(wl.programs) + 1) + 2
        self.pools = [Pool(n_blocks, bs, self.L, self.H, self.D, device, dtype) for _ in range(wl.cluster.backends)]
        rng = np.random.default_rng([seed, 5])
        groups = {p.prefix_group for p in wl.programs}
        gtok = {g: rng.integers(0, c.vocab_size, 10**4).tolist() for g in sorted(groups)}
        self.seq, self.obs = [], []
        for i, p in enumerate(wl.programs):
            r = np.random.default_rng([seed, i, 9])
            s = p.shared_prefix_tokens
            self.seq.append(gtok[p.prefix_group][:s] + r.integers(0, c.vocab_size, p.prompt_tokens - s).tolist())
            self.obs.append([r.integers(0, c.vocab_size, st.obs_tokens).tolist() for st in p.steps])
        self.generated = [[] for _ in wl.programs]  # positions of generated tokens
        self.entries = [dict() for _ in self.pools]  # key -> [blocks, tokens]
        self.step = [0] * len(wl.programs)
        self.gen = [0] * len(wl.programs)
        self.next_tok: dict[int, int] = {}
        self.kv_len: dict[int, int] = {}
        self.chunks: list[dict] = []
        self.parity_args = None

    # -------------------------------------------------------------- model pieces
    def _qkv(self, blk, x, pos):
        """x: (N, C) normed input of tokens at absolute positions pos (N,) → q, k, v (N, H, D)."""
        N = x.shape[0]
        q, k, v = blk.attn.qkv(x).split(self.H * self.D, dim=-1)
        q, k, v = (t.view(N, self.H, self.D) for t in (q, k, v))
        cos, sin = self.model.rope_cos[pos], self.model.rope_sin[pos]          # (N, D/2)
        q = apply_rope(q.transpose(0, 1), cos, sin).transpose(0, 1)
        k = apply_rope(k.transpose(0, 1), cos, sin).transpose(0, 1)
        return q, k, v

    def _table(self, b: int, pid: int) -> list[int]:
        p = self.wl.programs[pid]
        pre = self.entries[b].get(("g", p.prefix_group), [[], 0])[0] if p.shared_prefix_tokens else []
        return pre + self.entries[b][pid][0]

    def _write(self, pool: Pool, layer: int, table: list[int], pos: torch.Tensor, k, v) -> None:
        bi = torch.tensor([table[int(t) // pool.bs] for t in pos], device=self.device)
        off = pos % pool.bs
        pool.k[layer][bi, off] = k
        pool.v[layer][bi, off] = v

    def _gather(self, pool: Pool, layer: int, table: list[int], n: int):
        ids = torch.tensor(table, device=self.device, dtype=torch.long)
        k = pool.k[layer][ids].reshape(-1, self.H, self.D)[:n]
        v = pool.v[layer][ids].reshape(-1, self.H, self.D)[:n]
        return k, v

    def _prefill(self, b: int, pid: int, start: int, end: int, table: list[int]) -> int:
        """Compute KV of positions [start, end) given cached [0, start); returns greedy next token."""
        pool = self.pools[b]
        idx = torch.tensor(self.seq[pid][start:end], device=self.device)
        pos = torch.arange(start, end, device=self.device)
        x = self.model.embed(idx)                                                 # (T, C)
        for li, blk in enumerate(self.model.blocks):
            q, k, v = self._qkv(blk, blk.norm1(x), pos)
            self._write(pool, li, table, pos, k, v)
            K, V = self._gather(pool, li, table, end)                             # (end, H, D)
            mask = torch.ones(end - start, end, dtype=torch.bool, device=self.device).tril(diagonal=start)
            y = F.scaled_dot_product_attention(q.transpose(0, 1), K.transpose(0, 1), V.transpose(0, 1), attn_mask=mask)
            x = x + blk.attn.proj(y.transpose(0, 1).reshape(end - start, -1))
            x = x + blk.mlp(blk.norm2(x))
        logits = self.model.norm(x[-1:]) @ self.model.unembed.T
        return int(logits.argmax(-1))

    def _decode(self, b: int, pids: list[int]) -> None:
        from kernels.paged_decode_attention import paged_decode_attention

        pool = self.pools[b]
        n = len(pids)
        toks = torch.tensor([self.next_tok[i] for i in pids], device=self.device)
        pos = torch.tensor([self.kv_len[i] for i in pids], device=self.device)
        for i in pids:  # the fed token becomes part of the sequence (a generated token)
            self.seq[i].append(self.next_tok[i])
            self.generated[i].append(len(self.seq[i]) - 1)
            self.kv_len[i] += 1
            self.gen[i] += 1
            self.pools[b].resize(self.entries[b][i][0], self.kv_len[i] - self.wl.programs[i].shared_prefix_tokens)
            self.entries[b][i][1] = self.kv_len[i] - self.wl.programs[i].shared_prefix_tokens
        tables = [self._table(b, i) for i in pids]
        M = max(len(t) for t in tables)
        bt = torch.tensor([t + [0] * (M - len(t)) for t in tables], device=self.device, dtype=torch.int32)
        lengths = pos + 1
        x = self.model.embed(toks)                                                # (n, C)
        for li, blk in enumerate(self.model.blocks):
            q, k, v = self._qkv(blk, blk.norm1(x), pos)
            for j in range(n):
                self._write(pool, li, tables[j], pos[j:j + 1], k[j:j + 1], v[j:j + 1])
            args = (q, pool.k[li], pool.v[li], bt, lengths)
            if self.parity_args is None and n > 1:
                self.parity_args = tuple(a.clone() for a in args)
            y = (self.rec.call("paged_decode_attention", paged_decode_attention, *args) if self.rec is not None
                 else paged_decode_attention(*args, backend="torch"))
            x = x + blk.attn.proj(y.reshape(n, -1))
            x = x + blk.mlp(blk.norm2(x))
        logits = self.model.norm(x) @ self.model.unembed.T
        nxt = logits.argmax(-1).tolist()
        for j, i in enumerate(pids):
            self.next_tok[i] = nxt[j]

    # -------------------------------------------------------------- trace replay
    @torch.no_grad()
    def replay(self, trace: list) -> None:
        pending_prefill = [0, 0]
        t_prefill = 0.0
        for op in trace:
            kind, b = op[0], op[1]
            if kind == "trim":
                key, tokens = op[2], op[3]
                if key in self.entries[b]:
                    e = self.entries[b][key]
                    self.pools[b].resize(e[0], tokens)
                    e[1] = tokens
                    if tokens == 0:
                        del self.entries[b][key]
            elif kind == "preempt":
                self.next_tok.pop(op[2], None)
                self.kv_len.pop(op[2], None)
            elif kind == "admit":
                t0 = time.perf_counter()
                _, _, pid, cached_priv, prefix_hit, total = op
                p = self.wl.programs[pid]
                s = p.shared_prefix_tokens
                assert len(self.seq[pid]) == total, "trace and engine disagree on the context length"
                if s:
                    g = ("g", p.prefix_group)
                    e = self.entries[b].setdefault(g, [[], 0])
                    if e[1] < s:  # (re)compute the missing part of the shared prefix
                        self.pools[b].resize(e[0], s)
                        self._prefill_prefix(b, pid, e[1], s, e[0])
                        e[1] = s
                e = self.entries[b].setdefault(pid, [[], 0])
                assert e[1] >= cached_priv
                self.pools[b].resize(e[0], total - s)
                e[1] = total - s
                self.next_tok[pid] = self._prefill(b, pid, s + cached_priv, total, self._table(b, pid)) \
                    if s + cached_priv < total else self._prefill(b, pid, total - 1, total, self._table(b, pid))
                self.kv_len[pid] = total
                new = total - s - cached_priv + (s - prefix_hit)
                pending_prefill[0] += new
                pending_prefill[1] += new * total
                t_prefill += time.perf_counter() - t0
            elif kind == "decode":
                _, _, pids, k, _ = op
                n = len(pids)
                t_read = sum(self.kv_len[i] for i in pids)
                t0 = time.perf_counter()
                for _ in range(k):
                    self._decode(b, pids)
                wall = time.perf_counter() - t0 + t_prefill
                self.chunks.append({"k": k, "n": n, "kv_read": k * t_read + n * k * (k - 1) / 2,
                                    "prefill": pending_prefill[0], "prefill_ctx": pending_prefill[1], "wall_s": wall})
                pending_prefill, t_prefill = [0, 0], 0.0
                for i in pids:
                    st = self.wl.programs[i].steps[self.step[i]]
                    if self.gen[i] >= st.decode_tokens:  # request complete: obs appended for the next call
                        self.seq[i].extend(self.obs[i][self.step[i]] if self.step[i] + 1 < len(self.wl.programs[i].steps) else [])
                        self.step[i] += 1
                        self.gen[i] = 0
                        self.next_tok.pop(i, None)
                        self.kv_len.pop(i, None)

    def _prefill_prefix(self, b, pid, start, end, blocks):
        self._prefill(b, pid, start, end, blocks)

    @torch.no_grad()
    def verify(self) -> dict:
        """Generated tokens that differ from the dense (uncached) greedy choice, and max |logit| gap."""
        mism, total = 0, 0
        for i, seq in enumerate(self.seq):
            idx = torch.tensor(seq, device=self.device)[None]
            logits = self.model(idx)[0]                                           # (T, V) dense, no cache
            for ppos in self.generated[i]:
                total += 1
                mism += int(int(logits[ppos - 1].argmax()) != seq[ppos])
        return {"generated_tokens": total, "mismatches": mism,
                "peak_blocks": [p.peak for p in self.pools], "pool_blocks": [p.n_blocks for p in self.pools],
                "steps_done": sum(self.step), "steps_total": sum(len(p.steps) for p in self.wl.programs)}


def fit_cost_model(chunks: list[dict]) -> dict:
    """Non-negative least squares of chunk wall time on the simulator's features (a, b, p, q);
    fit on even chunks, error on odd (held-out) chunks."""
    from scipy.optimize import nnls

    X = np.array([[c["k"], c["kv_read"], c["prefill"], c["prefill_ctx"]] for c in chunks], dtype=float)
    y = np.array([c["wall_s"] for c in chunks])
    scale = np.maximum(X.max(0), 1e-12)
    tr, te = np.arange(len(y)) % 2 == 0, np.arange(len(y)) % 2 == 1
    coef, _ = nnls(X[tr] / scale, y[tr])
    coef = coef / scale
    pred = X @ coef
    mape = float(np.mean(np.abs(pred[te] - y[te]) / np.maximum(y[te], 1e-9)))
    ss = float(((y[te] - y[te].mean()) ** 2).sum())
    r2 = 1 - float(((pred[te] - y[te]) ** 2).sum()) / ss if ss > 0 else float("nan")
    total_err = float(abs(pred[te].sum() - y[te].sum()) / max(y[te].sum(), 1e-12))
    return {"a": float(coef[0]), "b": float(coef[1]), "p": float(coef[2]), "q": float(coef[3]),
            "heldout_mape": mape, "heldout_r2": r2, "heldout_total_time_rel_err": total_err,
            "n_chunks": len(y)}


def engine_model_config(max_seq_len: int) -> TinyTransformerConfig:
    return TinyTransformerConfig(vocab_size=128, d_model=64, n_layers=2, n_heads=4, max_seq_len=max_seq_len)
