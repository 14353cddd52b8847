"""The reversal curse and the Identity Bridge on a Hugging Face decoder (issue 41; the ``full`` profile's real path).

The paper's real experiment fine-tunes a ~1B pretrained decoder on the synthetic facts written as text
("Alice's husband is Bob"), with and without the identity bridge ("The name of Alice is Alice"), and
measures reversal success on held-out pairs. Here the SAME facts table that prepare@reversal_curse writes
(columns ``pair, entity, relation, target, kind, split``; token ids a_i = i, b_i = n + i, r+ = 2n, r- = 2n+1,
r_id = 2n+2) is rendered as text and trained into any HF causal LM:

* ``load_facts(ref)``: the facts table from a ``save_to_disk`` folder (prepare's output) or a jsonl/parquet
  file in the same schema, checked (columns and types, kinds, splits, ids in range, one forward fact per pair)
  with one-line ``SourceError``s.
* ``entity_name(e, n)``: a deterministic two-word name per entity (syllable names: several sub-word pieces
  each); ``render(...)``: prompt/completion text of a fact — forward "{a}'s husband is" -> " {b}", reverse
  "{b}'s wife is" -> " {a}", identity "The name of {e} is" -> " {e}" (the paper's example sentences).
* ``sft_loss``: next-token cross-entropy on the completion tokens only (prompt masked by token length,
  ``stages.common.hf.encode_pairs``) through the paper's fused linear + cross-entropy kernel
  (``kernels.fused_linear_ce``) on the decoder's last hidden states and the unembedding.
* ``candidate_scores``: log p(name | prompt) of every candidate entity of the target's side (summed over
  the name's tokens, per-token log-probs from the same kernel). Top-1 over the n candidates is the
  accuracy (chance 1/n); the score matrix read from the model, centred per prompt, is the HF analogue of
  W_OV for ``stages.reversal_curse.measures.offdiag_asymmetry`` (u_i = S[a_i | b_i, r-], v_i = S[b_i | a_i, r+]).
* ``train_arm`` / ``run_full``: per seed and arm (bridge none / A / B / AB, the same ``arm_mask`` as the toy),
  AdamW fine-tuning from the pretrained checkpoint, accuracy curves and the final measures in
  ``hf/results.json`` (+ ``hf/kernels.json``). train@reversal_curse calls it before the toy models when
  ``source.kind`` is hf/file (the full profile); evaluate/report do not read it yet.
"""
from __future__ import annotations

import copy
from typing import Literal

import numpy as np
import torch
from pydantic import Field

from kernels.fused_linear_ce import linear_cross_entropy, linear_cross_entropy_stats
from stages.common.config import StageConfig
from stages.common.hf import encode_pairs, load_records
from stages.common.sources import SourceError
from stages.reversal_curse.facts import ARMS, arm_mask
from stages.reversal_curse.measures import offdiag_asymmetry

FACT_COLUMNS = {"pair": "int", "entity": "int", "relation": "int", "target": "int", "kind": "string",
                "split": "string"}
KINDS = ("forward", "reverse", "identity_A", "identity_B")
KERNEL = "fused_linear_ce"
_SYL = ("ka", "lo", "mi", "ren", "sa", "tor", "vel", "dun", "ari", "bel", "cor", "dia", "el", "fin", "gar",
        "hal", "iso", "jun", "kel", "lyn", "mar", "nor", "ola", "pim")


class HFTrainOptions(StageConfig):
    """The real-model fine-tuning (read only when ``source.kind`` is hf/file)."""
    arms: list[Literal["none", "A", "B", "AB"]] = Field(default_factory=lambda: ["none", "AB"], min_length=1,
                                                        max_length=4)
    lr: float = Field(1e-4, gt=0, le=1.0)
    weight_decay: float = Field(0.0, ge=0, le=10.0)
    steps: int = Field(2000, ge=1, le=1_000_000)
    batch_size: int = Field(64, ge=1, le=65536)
    eval_every: int = Field(200, ge=1, le=1_000_000)
    eval_batch: int = Field(256, ge=1, le=65536, description="sequences per scoring forward")
    eval_pairs: int | None = Field(None, ge=1, le=1_000_000, description="in-distribution pairs scored for the "
                                   "forward / in-distribution reverse accuracies (None: all; held-out: always all)")


def entity_name(e: int, n: int) -> str:
    """Deterministic, unique two-word name of entity id e in [0, 2n) (up to 24³ distinct first names)."""
    if not 0 <= e < 2 * n:
        raise ValueError(f"entity_name: id {e} outside [0, {2 * n})")
    first = _SYL[e % 24].capitalize() + _SYL[(e // 24) % 24] + _SYL[(e // 576) % 24]
    last = _SYL[(7 * e + 3) % 24].capitalize() + ("son" if e < n else "ford")
    return f"{first} {last}"


def render(kind: str, entity: int, target: int, n: int) -> tuple[str, str]:
    """(prompt, completion) text of one fact [entity, relation] -> target."""
    e, t = entity_name(entity, n), entity_name(target, n)
    if kind == "forward":
        return f"{e}'s husband is", f" {t}"
    if kind == "reverse":
        return f"{e}'s wife is", f" {t}"
    if kind in ("identity_A", "identity_B"):
        return f"The name of {e} is", f" {t}"
    raise ValueError(f"render: unknown fact kind {kind!r}")


def load_facts(ref: str, *, key: str = "source.dataset", split: str = "train") -> dict[str, np.ndarray]:
    """The facts table (prepare's ``save_to_disk`` world folder, or jsonl/parquet in the same schema) as
    numpy columns, with the world's structure checked; ``n`` (pairs) is returned under ``"n"``."""
    ds = load_records(ref, columns=FACT_COLUMNS, key=key, split=split)
    cols = {c: np.asarray(ds[c]) for c in FACT_COLUMNS}
    bad = sorted(set(cols["kind"].tolist()) - set(KINDS))
    if bad:
        raise SourceError(f"{key}: {ref} has unknown fact kinds {bad} (kinds: {', '.join(KINDS)})")
    badsplit = sorted(set(cols["split"].tolist()) - {"train", "test"})
    if badsplit:
        raise SourceError(f"{key}: {ref} has unknown splits {badsplit} (train, test)")
    fwd = cols["kind"] == "forward"
    n = int(fwd.sum())
    if n < 2 or sorted(cols["pair"][fwd].tolist()) != list(range(n)):
        raise SourceError(f"{key}: {ref} must hold one forward fact per pair 0..n-1 (found {n} forward facts)")
    for c in ("entity", "target"):
        if cols[c].min() < 0 or cols[c].max() >= 2 * n:
            raise SourceError(f"{key}: {ref} column {c!r} has ids outside the {2 * n} entities of {n} pairs")
    rel = {"forward": 2 * n, "reverse": 2 * n + 1, "identity_A": 2 * n + 2, "identity_B": 2 * n + 2}
    for kind, r in rel.items():
        m = cols["kind"] == kind
        if m.any() and not (cols["relation"][m] == r).all():
            raise SourceError(f"{key}: {ref} {kind} facts must have relation id {r} (the toy vocabulary of {n} pairs)")
    side_ok = {"forward": (cols["entity"] < n) & (cols["target"] == cols["entity"] + n),
               "reverse": (cols["entity"] >= n) & (cols["target"] == cols["entity"] - n),
               "identity_A": (cols["entity"] < n) & (cols["target"] == cols["entity"]),
               "identity_B": (cols["entity"] >= n) & (cols["target"] == cols["entity"])}
    for kind, ok in side_ok.items():
        m = cols["kind"] == kind
        if not ok[m].all():
            raise SourceError(f"{key}: {ref} has {kind} facts whose entity/target do not match the pair ids")
    if not ((cols["split"] == "test") & (cols["kind"] == "reverse")).any():
        raise SourceError(f"{key}: {ref} holds out no reverse fact (no split == 'test' reverse row)")
    cols["n"] = np.asarray(n)
    return cols


def _decoder_and_unembed(model):
    """(the decoder stack returning last hidden states, the unembedding weight (V, d)) of an HF causal LM."""
    out = model.get_output_embeddings()
    if out is None or getattr(out, "bias", None) is not None:
        raise SourceError("source.model: the causal LM needs a bias-free output embedding (lm_head)")
    base = getattr(model, model.base_model_prefix, None) or model.base_model
    return base, out.weight


def _hidden(model, batch):
    base, w = _decoder_and_unembed(model)
    h = base(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state[:, :-1]
    return h, w


def sft_loss(model, tok, prompts: list[str], completions: list[str], rec=None) -> torch.Tensor:
    """Mean cross-entropy over the completion tokens (prompt masked), via the fused linear+CE kernel."""
    batch = {k: v.to(model.device) for k, v in encode_pairs(tok, prompts, completions, add_eos=False).items()}
    h, w = _hidden(model, batch)
    y = batch["labels"].reshape(-1)
    keep = y != -100
    args = (h.reshape(-1, h.shape[-1])[keep], w, y[keep])
    return rec.call(KERNEL, linear_cross_entropy, *args) if rec is not None else linear_cross_entropy(*args)


@torch.no_grad()
def completion_logprob(model, tok, prompts: list[str], completions: list[str], rec=None,
                       batch_size: int = 256) -> torch.Tensor:
    """Σ_t log p(completion token t | prefix) for every (prompt, completion): (N,)."""
    out = []
    for i in range(0, len(prompts), batch_size):
        batch = {k: v.to(model.device) for k, v in
                 encode_pairs(tok, prompts[i:i + batch_size], completions[i:i + batch_size], add_eos=False).items()}
        h, w = _hidden(model, batch)
        y = batch["labels"]
        args = (h.reshape(-1, h.shape[-1]), w, y.reshape(-1))
        loss, _ = (rec.call(KERNEL, linear_cross_entropy_stats, *args) if rec is not None
                   else linear_cross_entropy_stats(*args))            # 0 on ignored (prompt / pad) rows
        out.append(-loss.view(y.shape).sum(1).float().cpu())
    return torch.cat(out)


@torch.no_grad()
def candidate_scores(model, tok, facts: dict[str, np.ndarray], rows: np.ndarray, rec=None,
                     batch_size: int = 256) -> torch.Tensor:
    """(len(rows), n) log p(name of candidate c | prompt of the fact), candidates = the n entities of the
    target's side (A: 0..n-1, B: n..2n-1), in id order."""
    n = int(facts["n"])
    prompts, comps = [], []
    for r in np.flatnonzero(rows):
        side = 0 if facts["target"][r] < n else n
        p, _ = render(str(facts["kind"][r]), int(facts["entity"][r]), int(facts["target"][r]), n)
        for c in range(side, side + n):
            prompts.append(p)
            comps.append(f" {entity_name(c, n)}")
    return completion_logprob(model, tok, prompts, comps, rec, batch_size).view(-1, n)


def accuracy(scores: torch.Tensor, facts: dict[str, np.ndarray], rows: np.ndarray) -> float:
    """Top-1 over the n candidates of the target's side."""
    n = int(facts["n"])
    target = torch.as_tensor(facts["target"][rows] % n)
    return float((scores.argmax(1) == target).float().mean())


def measures(model, tok, facts: dict[str, np.ndarray], rec=None, batch_size: int = 256,
             eval_pairs: int | None = None) -> dict:
    """Accuracies (held-out reverse, in-distribution reverse, forward) and the held-out forward/reverse
    asymmetry of the centred score matrix read from the model. ``eval_pairs`` (None: all): the in-distribution
    and forward accuracies use the first ``eval_pairs`` in-distribution pairs (by pair id) — the forward facts
    of every held-out pair are always scored (the asymmetry needs them); held-out reversals are all scored."""
    n = int(facts["n"])
    kind, split, pair = facts["kind"], facts["split"], facts["pair"]
    held = (split == "test") & (kind == "reverse")
    held_pairs = set(pair[held].tolist())
    indist_pairs = [p for p in range(n) if p not in held_pairs]
    chosen = set(indist_pairs if eval_pairs is None else indist_pairs[:eval_pairs])
    in_chosen = np.isin(pair, sorted(chosen))
    sets = {"reverse_acc": held,
            "indist_reverse_acc": (split == "train") & (kind == "reverse") & in_chosen,
            "forward_acc": (kind == "forward") & (in_chosen | np.isin(pair, sorted(held_pairs)))}
    out, scores = {}, {}
    for name, rows in sets.items():
        scores[name] = candidate_scores(model, tok, facts, rows, rec, batch_size)
        out[name] = accuracy(scores[name], facts, rows)
    # S[out, in] (2n × 2n, only the A×B and B×A blocks filled): centred log p(out | [in, relation])
    S = torch.zeros(2 * n, 2 * n, dtype=torch.float64)
    rev_pairs = torch.as_tensor(facts["pair"][sets["reverse_acc"]]).long()
    rev = scores["reverse_acc"].double()                     # in b_i (held out), out: the n A entities
    rev = rev - rev.mean(1, keepdim=True)
    S[:n, n + rev_pairs] = rev.T
    fwd_pairs = torch.as_tensor(facts["pair"][sets["forward_acc"]]).long()
    fwd = scores["forward_acc"].double()                     # in a_i, out: the n B entities
    S[n:, fwd_pairs] = (fwd - fwd.mean(1, keepdim=True)).T
    out["heldout_asymmetry"] = offdiag_asymmetry(S, rev_pairs, rev_pairs + n)
    rows = torch.arange(len(rev_pairs))
    other = rev.clone()
    other[rows, rev_pairs] = -torch.inf
    out["heldout_reverse_margin"] = float((rev[rows, rev_pairs] - other.max(1).values).mean())
    return out


def arm_texts(facts: dict[str, np.ndarray], arm: str) -> tuple[list[str], list[str]]:
    """Prompt/completion texts of the arm's training facts (forward + in-distribution reverse + bridge)."""
    n = int(facts["n"])
    rows = np.flatnonzero(arm_mask(facts["kind"], facts["split"], arm))
    pairs = [render(str(facts["kind"][r]), int(facts["entity"][r]), int(facts["target"][r]), n) for r in rows]
    return [p for p, _ in pairs], [c for _, c in pairs]


def train_arm(model, tok, facts: dict[str, np.ndarray], arm: str, opts: HFTrainOptions, seed: int, rec=None) -> dict:
    """AdamW fine-tuning on the arm's facts (shuffled minibatches), accuracy curve every eval_every steps."""
    if arm not in ARMS:
        raise ValueError(f"train_arm: unknown arm {arm!r}")
    prompts, comps = arm_texts(facts, arm)
    opt = torch.optim.AdamW(model.parameters(), lr=opts.lr, weight_decay=opts.weight_decay)
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(prompts), generator=gen)
    pos, curve, losses = 0, [], []
    for step in range(opts.steps):
        if pos + opts.batch_size > len(order):
            order, pos = torch.randperm(len(prompts), generator=gen), 0
        idx = order[pos:pos + opts.batch_size].tolist()
        pos += len(idx)
        model.train()
        opt.zero_grad(set_to_none=True)
        loss = sft_loss(model, tok, [prompts[i] for i in idx], [comps[i] for i in idx], rec)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if (step + 1) % opts.eval_every == 0 or step + 1 == opts.steps:
            model.eval()
            m = measures(model, tok, facts, rec, opts.eval_batch, opts.eval_pairs)
            curve.append({"step": step + 1, **m})
    return {"arm": arm, "seed": seed, "train_facts": len(prompts), "losses": losses, "curve": curve,
            "final": curve[-1]}


def run_full(cfg, ctx) -> None:
    """train@reversal_curse with a real source: every prepare seed's main world, every arm of ``cfg.hf``,
    fine-tuned from ``cfg.source.model`` (the tokenizer: ``source.tokenizer`` or the model's)."""
    from kernels.record import KernelRecord
    from stages.common.hf import load_tokenizer, pretrained_causal_lm
    from stages.common.paths import read_json, write_json
    from stages.reversal_curse.prepare import world_dir

    key = "papers.reversal_curse.train.source"
    src = cfg.source
    tok = load_tokenizer(src.tokenizer or src.model, key=f"{key}.{'tokenizer' if src.tokenizer else 'model'}",
                         revision=None if src.tokenizer else src.revision)
    if tok.pad_token_id is None:
        raise SourceError(f"{key}.tokenizer: no pad token (and no eos to use as one)")
    base = pretrained_causal_lm(src, key=key)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    base = base.to(device)
    rec = KernelRecord(device)
    prep = ctx.input("prepare")
    meta = read_json(prep / "meta.json")
    results = []
    for seed in meta["seeds"]:
        facts = load_facts(str(prep / world_dir("main", seed)), key=f"{key}.dataset (prepare main_s{seed})")
        model = copy.deepcopy(base)
        before = measures(model.eval(), tok, facts, rec, cfg.hf.eval_batch, cfg.hf.eval_pairs)
        del model
        for arm in cfg.hf.arms:
            print(f"train@reversal_curse (real source): arm={arm} seed={seed}")
            model = copy.deepcopy(base)
            torch.manual_seed(seed)
            r = train_arm(model, tok, facts, arm, cfg.hf, seed, rec)
            results.append({**r, "before": before})
            del model
    out = ctx.out / "hf"
    out.mkdir(parents=True, exist_ok=True)
    rec.save(out)
    write_json(out / "results.json", {"source": src.model_dump(mode="json"), "n_pairs": meta["worlds"]["main"]
                                             ["n_pairs"], "seeds": meta["seeds"], "hf": cfg.hf.model_dump(),
                                             "device": str(device), "runs": results})
