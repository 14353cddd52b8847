"""A small real serving engine: the shared tiny GPT with a paged KV cache, replaying a scheduler trace.

The simulator (sim.py) run with ``trace=True`` records every engine operation its scheduler decided:
admit (with how many private / shared-prefix tokens were found cached), decode chunks of k
iterations over a batch, LRU trims of cache entries, preemptions. ``PagedEngine.replay`` executes that
trace with real tensors: a block pool per backend and layer, (N_blocks, BS, H, D); shared-prefix
blocks referenced by every program of the group; prefill of the missing tokens (dense attention over
the gathered cached prefix); batched greedy decode whose attention is kernels.paged_decode_attention
over the block tables. Every prefill and decode chunk is timed (thread CPU time and wall time) with
the simulator's cost features, so costmodel.fit_cost_model can fit a, b, p, q, r. ``verify`` re-runs each program's final token sequence densely
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
        self.ops: list[dict] = []     # timed prefill / decode operations (cost-model features + times)
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
        """Execute a simulator trace; every prefill (admit) and decode chunk is timed (thread CPU time and
        wall time) with the cost model's features into ``self.ops``."""
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
                c0, w0 = time.thread_time(), time.perf_counter()
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
                self.ops.append({"kind": "prefill", "prefill": new, "prefill_ctx": new * total,
                                 "prefill_calls": int(new > 0), "cpu_s": time.thread_time() - c0,
                                 "wall_s": time.perf_counter() - w0})
            elif kind == "decode":
                _, _, pids, k, _ = op
                n = len(pids)
                t_read = sum(self.kv_len[i] for i in pids)
                c0, w0 = time.thread_time(), time.perf_counter()
                for _ in range(k):
                    self._decode(b, pids)
                self.ops.append({"kind": "decode", "iters": k, "kv_read": k * t_read + n * k * (k - 1) / 2, "n": n,
                                 "cpu_s": time.thread_time() - c0, "wall_s": time.perf_counter() - w0})
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


def engine_model_config(max_seq_len: int) -> TinyTransformerConfig:
    return TinyTransformerConfig(vocab_size=128, d_model=64, n_layers=2, n_heads=4, max_seq_len=max_seq_len)


class OnlineEngine:
    """The same tiny GPT and paged KV pool, serving one request at a time (the backend of backend_server).

    generate(tokens, max_new) prefills the prompt densely into the request's blocks and decodes greedily
    through kernels.paged_decode_attention over its block table; blocks are freed after the request (no
    cross-request prefix cache: every call is a full prefill, documented in backend_server).
    """

    def __init__(self, capacity_tokens: int, model_cfg: TinyTransformerConfig, seed: int = 0, block_size: int = 16,
                 device="cpu", dtype=torch.float32):
        torch.manual_seed(seed)
        self.model = TinyTransformer(model_cfg).to(device=device, dtype=dtype).eval()
        c = model_cfg
        self.H, self.D, self.L, self.device = c.n_heads, c.d_model // c.n_heads, c.n_layers, device
        self.max_len = c.max_seq_len
        self.pool = Pool(max(2, capacity_tokens // block_size), block_size, self.L, self.H, self.D, device, dtype)

    def _qkv(self, blk, x, pos):
        N = x.shape[0]
        q, k, v = blk.attn.qkv(x).split(self.H * self.D, dim=-1)
        q, k, v = (t.view(N, self.H, self.D) for t in (q, k, v))
        cos, sin = self.model.rope_cos[pos], self.model.rope_sin[pos]
        q = apply_rope(q.transpose(0, 1), cos, sin).transpose(0, 1)
        k = apply_rope(k.transpose(0, 1), cos, sin).transpose(0, 1)
        return q, k, v

    def _write(self, layer, table, pos, k, v):
        bs = self.pool.bs
        bi = torch.tensor([table[int(t) // bs] for t in pos], device=self.device)
        self.pool.k[layer][bi, pos % bs] = k
        self.pool.v[layer][bi, pos % bs] = v

    @torch.no_grad()
    def generate(self, tokens: list[int], max_new: int) -> list[int]:
        from kernels.paged_decode_attention import paged_decode_attention

        n = len(tokens)
        if n < 1 or n + max_new > self.max_len:
            raise ValueError(f"prompt of {n} tokens + {max_new} new exceeds the model length {self.max_len}")
        table: list[int] = []
        try:
            self.pool.resize(table, n + max_new)
            idx = torch.tensor(tokens, device=self.device)
            pos = torch.arange(n, device=self.device)
            x = self.model.embed(idx)                                            # (T, C)
            mask = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()
            for li, blk in enumerate(self.model.blocks):
                q, k, v = self._qkv(blk, blk.norm1(x), pos)
                self._write(li, table, pos, k, v)
                y = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                                   attn_mask=mask)
                x = x + blk.attn.proj(y.transpose(0, 1).reshape(n, -1))
                x = x + blk.mlp(blk.norm2(x))
            nxt = int((self.model.norm(x[-1:]) @ self.model.unembed.T).argmax(-1))
            out = [nxt]
            bt = torch.tensor([table], device=self.device, dtype=torch.int32)
            for step in range(1, max_new):
                p = n + step - 1                                                  # position of the fed token
                x = self.model.embed(torch.tensor([nxt], device=self.device))
                ppos = torch.tensor([p], device=self.device)
                for li, blk in enumerate(self.model.blocks):
                    q, k, v = self._qkv(blk, blk.norm1(x), ppos)
                    self._write(li, table, ppos, k, v)
                    y = paged_decode_attention(q, self.pool.k[li], self.pool.v[li], bt,
                                               torch.tensor([p + 1], device=self.device), backend="torch")
                    x = x + blk.attn.proj(y.reshape(1, -1))
                    x = x + blk.mlp(blk.norm2(x))
                nxt = int((self.model.norm(x) @ self.model.unembed.T).argmax(-1))
                out.append(nxt)
            return out[:max_new]
        finally:
            self.pool.resize(table, 0)
