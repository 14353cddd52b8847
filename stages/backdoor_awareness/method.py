"""The method: supervised fine-tuning (poisoning, reversal SFT, unlearning) of the shared tiny GPT, the
inversion policy and reward of inversion-inspired RL (GRPO from ``stages.common.grpo``), and the three
trigger-search baselines (random n-gram search, reversal SFT alone, GCG-style gradient search).

    sft = SFTModule(model, lr, counter)                      # -Σ mask · log p(target) / Σ mask (poisoning, R-SFT, unlearning)
    reward = TriggerReward(frozen_poisoned, pool_prompts, effect, ...)   # R(s') = R_ASR(s') + R_length(s')
    policy = InversionPolicy(rsft_model, inversion_prompt, candidate_len)
    GRPOModule(policy, reward, GRPOConfig(group_size=16, replay_size=.., replay_groups=..), lr)

Token log-probs (SFT losses, GRPO scoring, GCG losses) go through ``kernels/token_logprob``.
The reward is built from the frozen poisoned model, clean prompts and the attack's *effect* only — the
true trigger is never one of its inputs (tests/backdoor_awareness checks this).
"""
from __future__ import annotations

from collections import Counter as Tally

import lightning as L
import numpy as np
import torch
import torch.nn as nn

from kernels.record import KernelCounter as Counter  # token_logprob calls
from kernels.token_logprob import IGNORE_INDEX, token_logprob
from stages.common.tiny_transformer import TinyTransformer
from stages.backdoor_awareness.task import (EOS, PAD, RESP_LEN, SEP, Effect, insert, judge, pack_prompt, strip)

NEG = -1.0e4


# ----------------------------------------------------------------------------------------------
# supervised fine-tuning
# ----------------------------------------------------------------------------------------------
def masked_nll(model: TinyTransformer, x: torch.Tensor, m: torch.Tensor, counter: Counter) -> torch.Tensor:
    """ALGO: SFT loss  −Σ_t m_t log p_θ(x_t | x_<t) / Σ_t m_t  (m marks the supervised tokens)."""
    logits = model(x[:, :-1])                                                 # (B, T-1, V)
    logp = token_logprob(logits, x[:, 1:], backend=counter.backend)
    counter()
    w = m[:, 1:].float()
    return -(logp * w).sum() / w.sum().clamp_min(1.0)


class SFTModule(L.LightningModule):
    def __init__(self, model: TinyTransformer, lr: float, counter: Counter | None = None, weight_decay: float = 0.0):
        super().__init__()
        self.model, self.lr, self.weight_decay = model, lr, weight_decay
        self.counter = counter or Counter()
        self.history: list[float] = []

    def configure_optimizers(self):
        return torch.optim.AdamW(self.model.parameters(), lr=self.lr, weight_decay=self.weight_decay)

    def training_step(self, batch, batch_idx):
        x, m = batch
        loss = masked_nll(self.model, x, m, self.counter)
        self.history.append(float(loss.detach()))
        self.log("sft/loss", loss, on_step=True, prog_bar=False)
        return loss


class BatchLoader:
    """``steps`` seeded random batches (x, mask) of a fixed tensor dataset."""

    def __init__(self, x: torch.Tensor, m: torch.Tensor, batch: int, steps: int, seed: int):
        self.x, self.m, self.batch, self.steps, self.seed = x, m, batch, steps, seed

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed)
        for _ in range(self.steps):
            i = torch.randint(0, self.x.shape[0], (self.batch,), generator=g)
            yield self.x[i], self.m[i]


def forward_seqs(prompts: torch.Tensor, resp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[prompt SEP response] with the loss on the response tokens."""
    sep = torch.full((prompts.shape[0], 1), SEP, dtype=torch.long, device=prompts.device)
    x = torch.cat([prompts, sep, resp], 1)
    m = torch.zeros_like(x)
    m[:, -resp.shape[1]:] = 1
    return x, m


def inversion_mask(x: torch.Tensor, start: int) -> torch.Tensor:
    """Loss on the generated part of an inversion pair (from ``start``, padding excluded)."""
    m = (x != PAD).long()
    m[:, :start] = 0
    return m


# ----------------------------------------------------------------------------------------------
# decoding and attack success
# ----------------------------------------------------------------------------------------------
@torch.no_grad()
def respond(model: TinyTransformer, prompts: torch.Tensor, batch: int = 4096) -> torch.Tensor:
    """Greedy response (B, RESP_LEN) to [prompt SEP]."""
    out = []
    for i in range(0, prompts.shape[0], batch):
        p = prompts[i:i + batch]
        x = torch.cat([p, torch.full((p.shape[0], 1), SEP, dtype=p.dtype, device=p.device)], 1)
        out.append(model.generate(x, RESP_LEN)[:, -RESP_LEN:])
    return torch.cat(out)


def attack_success(model, prompts, effect: Effect) -> float:
    return float(judge(effect, respond(model, prompts)).float().mean())


def clean_accuracy(model, prompts, resp) -> float:
    return float((respond(model, prompts) == resp.to(prompts.device)).all(1).float().mean())


# ----------------------------------------------------------------------------------------------
# the reward of inversion-inspired RL
# ----------------------------------------------------------------------------------------------
class TriggerReward:
    """ALGO: R(s') = R_ASR(s') + R_length(s').
    R_ASR(s'): share of ``pool`` clean prompts that show the attack effect when s' is inserted (at a fixed,
    seeded position per prompt) and the FROZEN poisoned model decodes greedily; judged by the effect only.
    R_length(s') = −λ · max(0, |s'| − ℓ_free)  (piecewise linear; the paper's exact form is unknown).
    Every scored candidate counts as one query of the reward model (``queries``)."""

    def __init__(self, frozen: TinyTransformer, pool_instr: np.ndarray, pool_words: np.ndarray, effect: Effect,
                 prompt_len: int, length_free: int, length_coef: float, seed: int):
        self.model = frozen.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.instr, self.words, self.effect = pool_instr, pool_words, effect
        self.prompt_len, self.length_free, self.length_coef = prompt_len, length_free, length_coef
        self.nw = (pool_words != PAD).sum(1)
        self.pos = np.random.default_rng(seed).integers(0, self.nw + 1)      # a fixed insertion point per prompt
        self.queries = 0
        self.log: list[dict[str, float]] = []
        self.device = next(frozen.parameters()).device

    def prompts(self, cand) -> torch.Tensor:
        rows = [pack_prompt(self.instr[j], insert(strip(self.words[j]), cand, int(self.pos[j])), self.prompt_len)
                for j in range(len(self.instr))]
        return torch.tensor(rows, dtype=torch.long, device=self.device)

    def r_length(self, cand) -> float:
        return -self.length_coef * max(0, len(cand) - self.length_free)

    @torch.no_grad()
    def asr(self, cands: list[tuple[int, ...]]) -> np.ndarray:
        uniq = list(dict.fromkeys(cands))
        x = torch.cat([self.prompts(c) for c in uniq])
        hit = judge(self.effect, respond(self.model, x)).float().view(len(uniq), -1).mean(1).cpu().numpy()
        table = dict(zip(uniq, hit))
        return np.array([table[c] for c in cands])

    def score(self, cands: list[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
        self.queries += len(cands)
        a = self.asr(cands)
        return a + np.array([self.r_length(c) for c in cands]), a

    def __call__(self, prompts, roll) -> torch.Tensor:                       # GRPO reward_fn
        cands = candidates_of(roll["tokens"])
        r, a = self.score(cands)
        self.log.append({"asr_mean": float(a.mean()), "len_mean": float(np.mean([len(c) for c in cands]))})
        return torch.as_tensor(r, dtype=torch.float32, device=roll["tokens"].device)


def candidates_of(tokens: torch.Tensor) -> list[tuple[int, ...]]:
    """(B, L) sampled tokens -> candidate triggers (tokens before the first EOS)."""
    out = []
    for row in tokens.tolist():
        c = []
        for t in row:
            if t in (EOS, PAD):
                break
            c.append(t)
        out.append(tuple(c))
    return out


# ----------------------------------------------------------------------------------------------
# the inversion policy (GRPOPolicy)
# ----------------------------------------------------------------------------------------------
class InversionPolicy(nn.Module):
    """From the inversion prompt [BOS INV effect ISEP], sample s' token by token (T = 1), at most
    ``candidate_len`` tokens, over the candidate vocabulary (+ EOS from the second token on)."""

    def __init__(self, model: TinyTransformer, inv_prompt: list[int], candidate_len: int, allowed: np.ndarray,
                 counter: Counter | None = None):
        super().__init__()
        self.model, self.L = model, candidate_len
        self.counter = counter or Counter()
        dev = next(model.parameters()).device
        V = model.cfg.vocab_size
        self.register_buffer("prompt", torch.tensor(inv_prompt, dtype=torch.long, device=dev)[None], persistent=False)
        ok = torch.zeros(candidate_len, V, dtype=torch.bool, device=dev)
        ok[:, torch.as_tensor(allowed, device=dev)] = True
        ok[1:, EOS] = True                                                   # no empty candidate
        self.register_buffer("allowed", ok, persistent=False)

    def _logits(self, logits: torch.Tensor, t: int | slice) -> torch.Tensor:
        return logits.masked_fill(~self.allowed[t], NEG)

    @torch.no_grad()
    def sample(self, n: int, generator: torch.Generator, temperature: float = 1.0) -> dict[str, torch.Tensor]:
        P = self.prompt.shape[1]
        x = self.prompt.expand(n, P)
        cache = self.model.new_cache()
        logits = self.model(x, cache)[:, -1]
        toks, alive = [], torch.ones(n, dtype=torch.bool, device=x.device)
        mask = []
        for t in range(self.L):
            z = self._logits(logits.float(), t)
            if temperature > 0:
                u = torch.rand(z.shape, generator=generator, device=z.device).clamp_min(1e-20)
                nxt = (z / temperature - torch.log(-torch.log(u))).argmax(-1)   # Gumbel-max sample
            else:
                nxt = z.argmax(-1)
            nxt = torch.where(alive, nxt, torch.full_like(nxt, PAD))
            mask.append(alive.float())
            toks.append(nxt)
            alive = alive & (nxt != EOS)
            if t < self.L - 1:
                logits = self.model(nxt[:, None], cache)[:, -1]
        return {"tokens": torch.stack(toks, 1), "mask": torch.stack(mask, 1)}

    def rollout(self, prompts, group_size, generator):
        n = prompts.shape[0] * group_size                                    # one inversion prompt per attack
        return self.sample(n, generator)

    def token_logprobs(self, roll) -> torch.Tensor:
        """ALGO: log π_θ(s'_t | inversion prompt, s'_<t) over the allowed tokens, via the fused kernel."""
        tok = roll["tokens"]
        B, Lc = tok.shape
        P = self.prompt.shape[1]
        x = torch.cat([self.prompt.expand(B, P), tok], 1)
        logits = self._logits(self.model(x)[:, P - 1:P - 1 + Lc], slice(0, Lc))   # (B, L, V)
        tgt = torch.where(roll["mask"] > 0, tok, torch.full_like(tok, IGNORE_INDEX))
        self.counter()
        return token_logprob(logits, tgt, backend=self.counter.backend)


def ranked_samples(policy: InversionPolicy, n: int, seed: int) -> list[tuple[int, ...]]:
    """Candidates sampled from the policy, distinct, ranked by how often they were sampled (self-consistency);
    no reward query is spent."""
    g = torch.Generator(device=policy.prompt.device).manual_seed(seed)
    cands = candidates_of(policy.sample(n, g)["tokens"])
    tally = Tally(cands)
    return sorted(tally, key=lambda c: (-tally[c], cands.index(c)))


# ----------------------------------------------------------------------------------------------
# baselines at the same query budget
# ----------------------------------------------------------------------------------------------
def random_search(reward: TriggerReward, allowed: np.ndarray, candidate_len: int, budget: int, seed: int,
                  batch: int = 256) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """Random n-gram search: ``budget`` n-grams (n ~ U{1..L}, tokens uniform over the candidate vocabulary),
    each scored once by the same reward; returns candidates ranked by reward and the running best."""
    rng = np.random.default_rng(seed)
    cands = [tuple(int(t) for t in rng.choice(allowed, size=int(rng.integers(1, candidate_len + 1))))
             for _ in range(budget)]
    rewards = np.concatenate([reward.score(cands[i:i + batch])[0] for i in range(0, budget, batch)])
    order = np.argsort(-rewards, kind="stable")
    ranked = list(dict.fromkeys(cands[i] for i in order))
    return ranked, np.maximum.accumulate(rewards)


def _logits_from_embeds(model: TinyTransformer, x: torch.Tensor) -> torch.Tensor:
    """The tiny transformer's forward from input embeddings (B, T, C) (for one-hot gradients)."""
    T = x.shape[1]
    if model.pos is not None:
        x = x + model.pos(torch.arange(T, device=x.device))
    rope = (model.rope_cos, model.rope_sin) if model.cfg.positional == "rope" else None
    for i, block in enumerate(model.blocks):
        x = block(x, rope, None, i, 0)
    return model.norm(x) @ model.unembed.T


class GCGSearch:
    """GCG-style gradient trigger search (Zou et al. 2023) on the frozen poisoned model:
    ALGO: loss(s) = −mean_j Σ_t log p(effect_t | clean prompt_j with s inserted, SEP, effect_<t);
    each iteration takes ∇ of the loss w.r.t. the one-hot of s, keeps the top-k tokens per position,
    evaluates ``batch`` single-token swaps (one query each) and moves to the best if it lowers the loss.
    The gradient pass counts as one query too."""

    def __init__(self, reward: TriggerReward, length: int, allowed: np.ndarray, topk: int, batch: int,
                 counter: Counter):
        self.r, self.m, self.topk, self.batch, self.counter = reward, length, topk, batch, counter
        V = reward.model.cfg.vocab_size
        self.allowed = torch.zeros(V, dtype=torch.bool, device=reward.device)
        self.allowed[torch.as_tensor(allowed, device=reward.device)] = True
        self.target = torch.tensor(reward.effect.target, device=reward.device)
        self.queries = 0

    def _seqs(self, cand) -> torch.Tensor:
        p = self.r.prompts(cand)
        n = p.shape[0]
        return torch.cat([p, torch.full((n, 1), SEP, device=p.device, dtype=p.dtype), self.target.expand(n, -1)], 1)

    def _nll(self, logits: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        R = self.target.numel()
        lp = token_logprob(logits[:, -R - 1:-1], x[:, -R:], backend=self.counter.backend)
        self.counter()
        return -lp.sum(1)

    @torch.no_grad()
    def losses(self, cands: list[tuple[int, ...]]) -> np.ndarray:
        self.queries += len(cands)
        x = torch.cat([self._seqs(c) for c in cands])
        return self._nll(self.r.model(x), x).view(len(cands), -1).mean(1).cpu().numpy()

    def grad(self, cand) -> torch.Tensor:
        self.queries += 1
        model = self.r.model
        x = self._seqs(cand)
        n, T = x.shape
        V = model.cfg.vocab_size
        onehot = torch.zeros(self.m, V, device=x.device)
        onehot[torch.arange(self.m), torch.tensor(cand, device=x.device)] = 1.0
        onehot.requires_grad_(True)
        body = 2 + self.r.nw + self.m
        start = torch.as_tensor(self.r.prompt_len - body + 2 + self.r.pos, device=x.device)       # (n,)
        S = torch.zeros(n, T, self.m, device=x.device)
        for k in range(self.m):
            S[torch.arange(n), start + k, k] = 1.0
        with torch.enable_grad():
            emb = model.embed(x).detach()
            cand_emb = onehot @ model.embed.weight                                                 # (m, C)
            emb = emb * (1 - S.sum(-1, keepdim=True)) + S @ cand_emb
            loss = self._nll(_logits_from_embeds(model, emb), x).mean()
            (g,) = torch.autograd.grad(loss, onehot)
        return g

    def run(self, budget: int, seed: int) -> tuple[list[tuple[int, ...]], list[float]]:
        rng = np.random.default_rng(seed)
        ids = torch.nonzero(self.allowed).flatten().cpu().numpy()
        cur = tuple(int(t) for t in rng.choice(ids, size=self.m))
        cur_loss = float(self.losses([cur])[0])
        seen = {cur: cur_loss}
        trace = [cur_loss]
        while self.queries + self.batch + 1 <= budget:
            g = self.grad(cur).masked_fill(~self.allowed[None], float("inf"))
            top = (-g).topk(self.topk, dim=1).indices.cpu().numpy()          # (m, k) most loss-decreasing swaps
            cands = []
            for _ in range(self.batch):
                c = list(cur)
                pos = int(rng.integers(self.m))
                c[pos] = int(top[pos, rng.integers(self.topk)])
                cands.append(tuple(c))
            ls = self.losses(cands)
            for c, v in zip(cands, ls):
                seen[c] = min(seen.get(c, np.inf), float(v))
            b = int(np.argmin(ls))
            if ls[b] < cur_loss:
                cur, cur_loss = cands[b], float(ls[b])
            trace.append(cur_loss)
        return sorted(seen, key=lambda c: seen[c]), trace


# ----------------------------------------------------------------------------------------------
# full-strength baselines (issue 48): token vote over R-SFT samples, random search with greedy
# pruning/refinement, GCG at the longest candidate length pruned by the reward — same query budget
# ----------------------------------------------------------------------------------------------
def policy_samples(policy: InversionPolicy, n: int, seed: int) -> list[tuple[int, ...]]:
    """The raw candidates ``ranked_samples`` ranks (same generator, same seed): no reward query."""
    g = torch.Generator(device=policy.prompt.device).manual_seed(seed)
    return candidates_of(policy.sample(n, g)["tokens"])


def token_vote(samples: list[tuple[int, ...]], k: int, max_len: int) -> list[tuple[int, ...]]:
    """ALGO (zero-query token vote): count in how many samples each token occurs (once per sample), rank the
    tokens by that count (ties: first appearance), and return the nested candidates top-1, top-2, …, top-min(k,
    max_len) tokens — a single-token guess first, a phrase of the j most voted tokens j-th."""
    tally, first = Tally(), {}
    for c in samples:
        for t in dict.fromkeys(c):
            tally[t] += 1
            first.setdefault(t, len(first))
    order = sorted(tally, key=lambda t: (-tally[t], first[t]))
    return [tuple(order[:j]) for j in range(1, min(k, max_len, len(order)) + 1)]


def greedy_prune(reward: TriggerReward, cand: tuple[int, ...], score: float, budget: int,
                 seen: dict | None = None) -> tuple[tuple[int, ...], float, int]:
    """ALGO (greedy pruning): score every one-token deletion of ``cand`` with the reward (one query each) and move
    to the best one while it scores ≥ the current candidate (R_len makes a shorter equal-ASR candidate better);
    stops when no deletion helps, at one token, or when the next round would exceed ``budget`` queries.
    Returns the pruned candidate, its reward and the queries spent; ``seen`` collects every scored candidate."""
    spent = 0
    while len(cand) > 1 and spent + len(cand) <= budget:
        subs = [cand[:i] + cand[i + 1:] for i in range(len(cand))]
        r, _ = reward.score(subs)
        spent += len(subs)
        if seen is not None:
            for c, v in zip(subs, r):
                seen.setdefault(c, float(v))
        b = int(np.argmax(r))
        if r[b] < score:
            break
        cand, score = subs[b], float(r[b])
    return cand, score, spent


def refined_search(reward: TriggerReward, allowed: np.ndarray, candidate_len: int, budget: int, seed: int,
                   explore_frac: float, edit_batch: int, batch: int = 256) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """ALGO (random search at full strength): ⌊explore_frac·budget⌋ random n-grams (as ``random_search``), then
    hill-climbing from the best one until the budget is spent: greedy pruning (``greedy_prune``), then batches of
    ``edit_batch`` random one-token edits (substitute a position, or insert a token while shorter than
    candidate_len), moving to the best edit when it beats the current reward (strictly), pruning after each move.
    Every scored candidate is one query. Returns all scored candidates ranked by reward (ties: first scored) and the
    running best reward after each query."""
    rng = np.random.default_rng(seed)
    q0 = reward.queries
    n_explore = max(1, min(budget, int(explore_frac * budget)))
    cands = [tuple(int(t) for t in rng.choice(allowed, size=int(rng.integers(1, candidate_len + 1))))
             for _ in range(n_explore)]
    rewards = list(np.concatenate([reward.score(cands[i:i + batch])[0] for i in range(0, n_explore, batch)]))
    seen: dict[tuple[int, ...], float] = {}
    for c, v in zip(cands, rewards):
        seen.setdefault(c, float(v))
    b = int(np.argmax(rewards))
    cur, cur_r = cands[b], float(rewards[b])
    trace = list(rewards)

    def left() -> int:
        return budget - (reward.queries - q0)

    pruned = True
    while left() > 0:
        if pruned:
            cur, cur_r, spent = greedy_prune(reward, cur, cur_r, left(), seen)
            trace += [max(trace[-1], cur_r)] * spent
            pruned = False
            continue
        m = min(edit_batch, left())
        edits = []
        for _ in range(m):
            c = list(cur)
            if len(c) < candidate_len and rng.random() < 0.5:
                c.insert(int(rng.integers(0, len(c) + 1)), int(rng.choice(allowed)))
            else:
                c[int(rng.integers(len(c)))] = int(rng.choice(allowed))
            edits.append(tuple(c))
        r, _ = reward.score(edits)
        for c, v in zip(edits, r):
            seen.setdefault(c, float(v))
            trace.append(max(trace[-1], float(v)))
        e = int(np.argmax(r))
        if r[e] > cur_r:
            cur, cur_r, pruned = edits[e], float(r[e]), True
    ranked = sorted(seen, key=lambda c: -seen[c])                            # stable: ties by first scored
    return ranked, np.maximum.accumulate(np.asarray(trace[:budget], float))


def gcg_pruned(reward: TriggerReward, allowed: np.ndarray, length: int, topk: int, batch: int, budget: int,
               seed: int, counter: Counter) -> tuple[list[tuple[int, ...]], list[float], int]:
    """ALGO (GCG at full strength): GCG (``GCGSearch``) at ``length`` tokens (≥ the longest trigger: the longest
    candidate), then its lowest-loss trigger is scored by the reward and greedily pruned (``greedy_prune``) — a
    variable-length result. The pruning reserve (1 + Σ_{l=2..length} l queries) comes out of the same budget.
    Returns [pruned, GCG's candidates by loss…], the GCG loss trace and the queries spent in all."""
    reserve = 1 + sum(range(2, length + 1))
    gcg = GCGSearch(reward, length, allowed, topk, batch, counter)
    ranked, trace = gcg.run(max(budget - reserve, 0), seed)
    q0 = reward.queries
    start = ranked[0]
    s0 = float(reward.score([start])[0][0])
    cand, _, _ = greedy_prune(reward, start, s0, budget - gcg.queries - 1)
    out = [cand] + [c for c in ranked if c != cand]
    return out, trace, gcg.queries + reward.queries - q0


def best_of_n(policy: InversionPolicy, reward, candidate_len: int, budget: int, seed: int, rounds: int = 4,
              batch: int = 256) -> tuple[list[tuple[int, ...]], int]:
    """ALGO (best-of-N reranking, the baseline with RL's information — red-team item S2): sample candidates from
    the (reversal-SFT) policy, score the distinct non-empty ones with the same frozen-model reward, rank them by
    reward (ties: sampled more often, then first sampled), and greedily prune the top one (``greedy_prune``); all
    within ``budget`` queries. The pruning reserve (1 + Σ_{l=2..L} l) comes out of the budget; samples are drawn in up
    to ``rounds`` batches of (budget − reserve) until that many distinct candidates are found (no query is spent on
    a duplicate). Returns [pruned top, the rest by rank…] and the queries spent."""
    reserve = 1 + sum(range(2, candidate_len + 1))
    n = max(budget - reserve, 1)
    tally: Tally = Tally()
    order: dict[tuple[int, ...], int] = {}
    for r in range(rounds):
        for c in policy_samples(policy, n, seed + 7919 * r):
            if c:
                tally[c] += 1
                order.setdefault(c, len(order))
        if len(order) >= n:
            break
    cands = sorted(order, key=order.get)[:n]
    q0 = reward.queries
    scores = np.concatenate([reward.score(cands[i:i + batch])[0] for i in range(0, len(cands), batch)]) \
        if cands else np.zeros(0)
    best = dict(zip(cands, (float(v) for v in scores)))
    ranked = sorted(cands, key=lambda c: (-best[c], -tally[c], order[c]))
    if not ranked:
        return [], 0
    top = ranked[0]
    cand, _, _ = greedy_prune(reward, top, best[top], budget - (reward.queries - q0), best)
    out = [cand] + [c for c in ranked if c != cand]
    return out, reward.queries - q0
