"""BRepGround-mini, its baselines, and the program model (prefix-LM seq2seq + GRPO policy).

BRepGround-mini (per query q and B-Rep B):
    t = TextEnc(words(q))                          scratch word embeddings + transformer encoder   (B, W, C)
    f = FaceEnc(UV grid of points/normals/mask)    UV-Net-style 2D conv over the UV grid, max-pool   (B, F, C)
    e = EdgeEnc(curve of points/tangents)          UV-Net-style 1D conv along the curve, max-pool    (B, E, C)
    h = Fusion([t; f + type; e + type])            transformer over text and primitive tokens
    s_p = w·h_p                                    one logit per face/edge
    # ALGO: Eq. 5 (grounding q → π ⊆ P(B)): π = {p : σ(s_p) > ½}, trained with BCE over primitives
"""
from __future__ import annotations

import json

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from stages.futurecad import cad

PAD, UNK = 0, 1


# ----------------------------------------------------------------------------------------------
# vocabulary and batching
# ----------------------------------------------------------------------------------------------
def build_vocab(texts) -> list[str]:
    words = sorted({w for t in texts for w in cad.tokenize_query(t)})
    return ["<pad>", "<unk>"] + words


def encode_query(text: str, vocab: dict[str, int], max_words: int) -> list[int]:
    ids = [vocab.get(w, UNK) for w in cad.tokenize_query(text)][:max_words]
    return ids + [PAD] * (max_words - len(ids))


def pad_parts(parts: list[dict], max_f: int, max_e: int) -> dict[str, torch.Tensor]:
    """Stack per-part primitive tensors, padded to (N, max_f, ...) / (N, max_e, ...)."""
    n = len(parts)
    faces = torch.zeros(n, max_f, cad.UV * cad.UV, cad.FACE_CH)
    edges = torch.zeros(n, max_e, cad.CURVE, cad.EDGE_CH)
    ftype = torch.zeros(n, max_f, dtype=torch.long)
    etype = torch.zeros(n, max_e, dtype=torch.long)
    fmask = torch.zeros(n, max_f, dtype=torch.bool)
    emask = torch.zeros(n, max_e, dtype=torch.bool)
    for i, p in enumerate(parts):
        nf, ne = p["faces"].shape[0], p["edges"].shape[0]
        if nf > max_f or ne > max_e:
            raise ValueError(f"part with {nf} faces / {ne} edges exceeds the model's {max_f} / {max_e}")
        faces[i, :nf], edges[i, :ne] = p["faces"], p["edges"]
        ftype[i, :nf], etype[i, :ne] = p["face_type"], p["edge_type"]
        fmask[i, :nf], emask[i, :ne] = True, True
    return {"faces": faces, "edges": edges, "face_type": ftype, "edge_type": etype, "fmask": fmask, "emask": emask}


def label_matrix(rows, parts: dict, max_f: int, max_e: int) -> torch.Tensor:
    """(Q, max_f + max_e) multi-hot targets: faces first, then edges."""
    y = torch.zeros(len(rows), max_f + max_e)
    for i, r in enumerate(rows):
        off = 0 if r["prim"] == "faces" else max_f
        for j in json.loads(r["target"]):
            y[i, off + j] = 1.0
    return y


# ----------------------------------------------------------------------------------------------
# BRepGround-mini
# ----------------------------------------------------------------------------------------------
class PackedEncoderLayer(nn.TransformerEncoderLayer):
    """A pre-norm ``nn.TransformerEncoderLayer`` (the same parameters and state_dict; torch's own forward still
    runs on padded input) that also runs on packed tokens: ``packed(xp, idx, B, L, key_mask)`` takes the N real
    tokens of a (B, L) batch as one (N, E) matrix (``idx``: their flat positions in the padded batch) and runs
    every position-wise op (layer norms, the in- and out-projections, the feed-forward) on those N rows only;
    the attention alone sees the padded (B, H, L, d_h) layout, with the padded keys masked out. A padded query's
    output is never computed, and no real token depends on it (its key is masked), so the real tokens' outputs are
    those of the padded layer, to float rounding (tests/futurecad/test_packed_encoder.py compares both with torch's
    layer on each sequence alone). At the grounder's batches ~35% of the fusion's slots are padding."""

    def packed(self, xp: torch.Tensor, idx: torch.Tensor, B: int, L: int, key_mask: torch.Tensor) -> torch.Tensor:
        if not self.norm_first or (self.training and self.dropout.p > 0):
            raise ValueError("PackedEncoderLayer.packed: needs norm_first=True and no dropout in training")
        mha = self.self_attn
        E, H = xp.shape[1], mha.num_heads
        proj = F.linear(self.norm1(xp), mha.in_proj_weight, mha.in_proj_bias)            # (N, 3E)
        full = proj.new_zeros(B * L, 3 * E).index_copy(0, idx, proj)                       # padded slots: 0
        q, k, v = full.view(B, L, 3, H, E // H).permute(2, 0, 3, 1, 4).unbind(0)           # (B, H, L, E/H)
        o = F.scaled_dot_product_attention(q, k, v, key_mask)       # ALGO: softmax(QKᵀ/√d_h + mask) V per head
        o = o.transpose(1, 2).reshape(B * L, E).index_select(0, idx)                       # (N, E)
        xp = xp + F.linear(o, mha.out_proj.weight, mha.out_proj.bias)
        return xp + self.linear2(self.activation(self.linear1(self.norm2(xp))))


def packed_encode(enc: nn.TransformerEncoder, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``enc``'s PackedEncoderLayers on the real tokens (``mask`` True) of x (B, L, E): returns their outputs
    (N, E) and their flat positions (N,) in the (B·L) layout."""
    B, L, E = x.shape
    idx = mask.reshape(-1).nonzero().squeeze(1)
    key_mask = torch.zeros(B, 1, 1, L, dtype=x.dtype, device=x.device).masked_fill_(~mask.view(B, 1, 1, L),
                                                                                      float("-inf"))
    xp = x.reshape(B * L, E).index_select(0, idx)
    for layer in enc.layers:
        xp = layer.packed(xp, idx, B, L, key_mask)
    return xp, idx


def _unpack(xp: torch.Tensor, idx: torch.Tensor, n: int) -> torch.Tensor:
    """(N, ...) rows back to their positions among n, zeros elsewhere."""
    return xp.new_zeros((n,) + xp.shape[1:]).index_copy(0, idx, xp)


def _encoder(d: int, heads: int, layers: int) -> nn.TransformerEncoder:
    layer = PackedEncoderLayer(d, heads, 2 * d, dropout=0.0, batch_first=True, norm_first=True)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


class BRepGround(nn.Module):
    def __init__(self, vocab_size: int, d: int = 64, heads: int = 4, text_layers: int = 1,
                 fusion_layers: int = 2, max_words: int = 24):
        super().__init__()
        self.word = nn.Embedding(vocab_size, d)
        self.wpos = nn.Embedding(max_words, d)
        self.text = _encoder(d, heads, text_layers)
        self.face_enc = nn.Sequential(nn.Conv2d(cad.FACE_CH, 32, 3, padding=1), nn.GELU(),
                                      nn.Conv2d(32, d, 3, padding=1), nn.GELU(), nn.AdaptiveMaxPool2d(1))
        self.edge_enc = nn.Sequential(nn.Conv1d(cad.EDGE_CH, 32, 3, padding=1), nn.GELU(),
                                      nn.Conv1d(32, d, 3, padding=1), nn.GELU(), nn.AdaptiveMaxPool1d(1))
        self.ftype = nn.Embedding(len(cad.FACE_TYPES), d)
        self.etype = nn.Embedding(len(cad.EDGE_TYPES), d)
        self.kind = nn.Embedding(3, d)                                           # text / face / edge
        self.fusion = _encoder(d, heads, fusion_layers)
        self.head = nn.Linear(d, 1)

    def forward(self, words, faces, edges, face_type, edge_type, fmask, emask, rows=None):
        """``rows`` (B,): the part of each query when faces/edges/types/masks are given once per part (P, ...);
        each part's primitives are then encoded once for all its queries (same numbers, less work). Only real
        tokens are computed (padded words, faces and edges never enter an encoder: packed_encode); the logits of
        padded primitives are 0."""
        B, W = words.shape
        P, Fn, G, Cf = faces.shape
        En = edges.shape[1]
        wmask = words != PAD
        t = self.word(words) + self.wpos(torch.arange(W, device=words.device))           # (B, W, C)
        tp, tidx = packed_encode(self.text, t, wmask)
        t = _unpack(tp, tidx, B * W).view(B, W, -1)
        fi, ei = fmask.reshape(-1).nonzero().squeeze(1), emask.reshape(-1).nonzero().squeeze(1)
        g = faces.reshape(P * Fn, cad.UV, cad.UV, Cf).index_select(0, fi).permute(0, 3, 1, 2)  # (faces, 7, UV, UV)
        f = _unpack(self.face_enc(g).flatten(1), fi, P * Fn).view(P, Fn, -1)
        f = f + self.ftype(face_type) + self.kind.weight[1]
        c = edges.reshape(P * En, cad.CURVE, -1).index_select(0, ei).permute(0, 2, 1)     # (edges, 6, CURVE)
        e = _unpack(self.edge_enc(c).flatten(1), ei, P * En).view(P, En, -1)
        e = e + self.etype(edge_type) + self.kind.weight[2]
        if rows is not None:                                                              # (P, ...) -> (B, ...)
            f, e, fmask, emask = f[rows], e[rows], fmask[rows], emask[rows]
        x = torch.cat([t + self.kind.weight[0], f, e], 1)                                 # (B, W+F+E, C)
        mask = torch.cat([wmask, fmask, emask], 1)
        hp, idx = packed_encode(self.fusion, x, mask)
        s = _unpack(self.head(hp).squeeze(-1), idx, B * x.shape[1]).view(B, -1)
        return s[:, W:]                                                                  # (B, F+E) logits


class GroundLoader:
    """``steps`` seeded batches of (query, part) rows. per_part > 1: batch // per_part parts drawn uniformly,
    per_part queries drawn from each, the parts' primitives given once (``rows`` maps queries to parts)."""

    def __init__(self, words, part_idx, y, parts, batch: int, steps: int, seed: int, per_part: int = 1):
        self.words, self.part_idx, self.y, self.parts = words, part_idx, y, parts
        self.batch, self.steps, self.seed, self.per_part = batch, steps, seed, per_part
        if per_part > 1:
            self.pids = torch.unique(part_idx)
            self.by_part = [torch.nonzero(part_idx == p).flatten() for p in self.pids.tolist()]

    def __len__(self):
        return self.steps

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed)
        for _ in range(self.steps):
            if self.per_part == 1:
                i = torch.randint(0, self.words.shape[0], (self.batch,), generator=g)
                p = self.part_idx[i]
                yield crop_batch({"words": self.words[i], "y": self.y[i], **{k: v[p] for k, v in self.parts.items()}})
                continue
            n = max(1, self.batch // self.per_part)
            picks = torch.randint(0, len(self.by_part), (n,), generator=g)
            i = torch.cat([self.by_part[k][torch.randint(0, len(self.by_part[k]), (self.per_part,), generator=g)]
                           for k in picks.tolist()])
            uniq, rows = torch.unique(self.part_idx[i], return_inverse=True)
            yield crop_batch({"words": self.words[i], "y": self.y[i], "rows": rows,
                              **{k: v[uniq] for k, v in self.parts.items()}})


def crop_batch(b: dict) -> dict:
    """Drop the padding slots no row of this batch uses (faces, edges, words); labels follow."""
    mf = b["fmask"].shape[1]
    nf = max(1, int(b["fmask"].sum(1).max()))
    ne = max(1, int(b["emask"].sum(1).max()))
    nw = max(1, int((b["words"] != PAD).sum(1).max()))
    out = dict(b, words=b["words"][:, :nw], faces=b["faces"][:, :nf], edges=b["edges"][:, :ne],
               face_type=b["face_type"][:, :nf], edge_type=b["edge_type"][:, :ne],
               fmask=b["fmask"][:, :nf], emask=b["emask"][:, :ne])
    if "y" in b:
        out["y"] = torch.cat([b["y"][:, :nf], b["y"][:, mf: mf + ne]], 1)
    return out


@torch.no_grad()
def predict(net: BRepGround, words, parts_batch: dict, threshold: float = 0.5, chunk: int = 256, rows=None):
    """Sigmoid scores (Q, F+E) with padding at −1, and the selected sets (score > threshold). ``rows`` (Q,):
    parts_batch holds each part once and rows[q] is query q's part (each part encoded once per chunk)."""
    net.eval()
    out = []
    mf, me = parts_batch["fmask"].shape[1], parts_batch["emask"].shape[1]
    for s in range(0, words.shape[0], chunk):
        sl = slice(s, s + chunk)
        if rows is None:
            b = crop_batch({"words": words[sl], **{k: v[sl] for k, v in parts_batch.items()}})
            r = None
        else:
            uniq, r = torch.unique(rows[sl], return_inverse=True)
            b = crop_batch({"words": words[sl], **{k: v[uniq] for k, v in parts_batch.items()}})
        logits = net(b["words"], b["faces"], b["edges"], b["face_type"], b["edge_type"], b["fmask"], b["emask"], r)
        mask = torch.cat([b["fmask"], b["emask"]], 1)
        mask = mask if r is None else mask[r]
        sc = torch.where(mask, torch.sigmoid(logits), torch.full_like(logits, -1.0))
        nf, ne = b["fmask"].shape[1], b["emask"].shape[1]
        full = torch.full((sc.shape[0], mf + me), -1.0, device=sc.device)
        full[:, :nf], full[:, mf: mf + ne] = sc[:, :nf], sc[:, nf:]
        out.append(full)
    scores = torch.cat(out)
    return scores, scores > threshold


# ----------------------------------------------------------------------------------------------
# baselines (operate on the exported primitive attributes; no learning)
# ----------------------------------------------------------------------------------------------
def _kind_of(words: list[str]) -> str:
    return "faces" if ("faces" in words or "face" in words) else "edges"


def keyword_rule(query: str, prims: cad.Primitives) -> tuple[str, list[int]]:
    """Keyword/rule selector written from the canonical template words: type word (straight / vertical /
    circular / planar / cylindrical) and place word (top / bottom / sides / step) → the matching
    geometric predicate. It does not know the paraphrases and does not parse size qualifiers."""
    w = cad.tokenize_query(query)
    prim = _kind_of(w)
    place = "top" if "top" in w else "bottom" if "bottom" in w else "step level" if "step" in w else "sides"
    if prim == "edges":
        tword = "vertical straight" if "vertical" in w else "circular" if "circular" in w else "straight"
    else:
        tword = "cylindrical" if "cylindrical" in w else "planar"
    if place == "sides" and tword not in ("vertical straight", "cylindrical"):
        place = "top"                                     # "sides" only names vertical edges / cylinders
    return prim, cad.target_ids(prims, (prim, tword, place, ""))


def type_only(query: str, prims: cad.Primitives) -> tuple[str, list[int]]:
    """Type-only selector: every primitive of the geometric type the query names."""
    w = cad.tokenize_query(query)
    prim = _kind_of(w)
    if prim == "edges":
        t = "CIRCLE" if "circular" in w else "LINE"
        return prim, [i for i, a in enumerate(prims.edge_attr) if a["type"] == t]
    t = "CYLINDER" if "cylindrical" in w else "PLANE"
    return prim, [i for i, a in enumerate(prims.face_attr) if a["type"] == t]


def _first_words(*keys: str) -> set[str]:
    return {phrase.split()[0] for k in keys for phrase in cad.SYNONYMS[k]}


PLACE_WORDS = {k: _first_words(k) for k in ("top", "bottom", "step level", "sides")}
EDGE_TYPE_WORDS = {"vertical straight": _first_words("vertical straight") | {"vertical"},
                   "circular": _first_words("circular"), "straight": _first_words("straight")}
FACE_TYPE_WORDS = {"cylindrical": _first_words("cylindrical"), "planar": _first_words("planar")}
SIZE_WORD_TABLE = {k: _first_words(k) for k in cad.SIZE_WORDS}
FACE_WORDS = {"face", "faces", "surface", "surfaces"}
EDGE_WORDS = {"edge", "edges"}


def synonym_rule(query: str, prims: cad.Primitives) -> tuple[str, list[int]]:
    """The keyword rule at full strength: every attribute word and paraphrase of the training queries
    (``cad.SYNONYMS``, the grounder's own training vocabulary) mapped to its predicate, size words included.
    A query naming no type word (or no place for a type that needs one) selects nothing (abstains). An edge word
    wins over a face word, which is usually the place ("the straight edges bounding the upper face")."""
    w = cad.tokenize_query(query)
    ws = set(w)
    prim = "faces" if ws & FACE_WORDS and not ws & EDGE_WORDS else "edges"
    size = next((k for k, words in SIZE_WORD_TABLE.items() if ws & words), "")
    table = EDGE_TYPE_WORDS if prim == "edges" else FACE_TYPE_WORDS
    tword = next((k for k, words in table.items() if ws & words), None)
    place = next((k for k, words in PLACE_WORDS.items() if ws & words), None)
    if tword in ("vertical straight", "cylindrical"):
        place = "sides"
    if tword is None or place is None or (place == "sides" and tword not in ("vertical straight", "cylindrical")):
        return prim, []
    if size and cad.SIZE_WORDS.index(size) >= 2 and (prim, tword) != ("edges", "straight"):
        size = ""                                   # longest/shortest only qualify straight edges
    if size and cad.SIZE_WORDS.index(size) < 2 and (prim, tword) == ("edges", "straight"):
        size = ""
    return prim, cad.target_ids(prims, (prim, tword, place, size))


def ranking_metrics(scores: np.ndarray, truth: set[int], ks=(3, 5, 10)) -> dict[str, float]:
    """Recall@k and average precision of one query: the primitives of the target's kind ranked by score
    (ties in id order). Needs a non-empty truth."""
    if not truth:
        raise ValueError("ranking_metrics: empty truth")
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    hits = np.array([int(i) in truth for i in order], dtype=np.float64)
    out = {f"recall@{k}": float(hits[:k].sum() / len(truth)) for k in ks}
    prec = np.cumsum(hits) / np.arange(1, len(hits) + 1)
    out["ap"] = float((prec * hits).sum() / len(truth))
    return out


def known_words(query: str, vocab: dict[str, int]) -> int:
    """Alphabetic query words in the grounder's vocabulary (an all-unknown query abstains)."""
    return sum(1 for t in cad.tokenize_query(query) if t.isalpha() and t in vocab)


def set_metrics(pred: set, truth: set) -> tuple[float, float]:
    """Exact-set accuracy and F1 of one selection."""
    exact = float(pred == truth)
    tp = len(pred & truth)
    f1 = 2 * tp / (len(pred) + len(truth)) if (pred or truth) else 1.0
    return exact, f1


# ----------------------------------------------------------------------------------------------
# program model: prefix-LM seq2seq (description -> script tokens) on the shared tiny transformer
# ----------------------------------------------------------------------------------------------
SPECIAL = ["<pad>", "<bos>", "<eos>", "<unk>"]
TPAD, BOS, EOS, TUNK = 0, 1, 2, 3


def desc_tokens(text: str) -> list[str]:
    return text.lower().replace(";", " ; ").split()


def build_program_vocab(descs, scripts) -> list[str]:
    toks = {t for d in descs for t in desc_tokens(d)} | {t for s in scripts for t in cad.script_tokens(s)}
    return SPECIAL + sorted(toks)


def encode_prompt(desc: str, vocab: dict[str, int], prompt_len: int) -> list[int]:
    ids = [vocab.get(t, TUNK) for t in desc_tokens(desc)][-(prompt_len - 1):] + [BOS]
    return [TPAD] * (prompt_len - len(ids)) + ids                                      # left-padded, ends in BOS


def encode_script(script: str, vocab: dict[str, int], script_len: int) -> list[int]:
    ids = [vocab.get(t, TUNK) for t in cad.script_tokens(script)][: script_len - 1] + [EOS]
    return ids + [TPAD] * (script_len - len(ids))


def decode_script(ids, itos: list[str]) -> str:
    out = []
    for i in ids:
        i = int(i)
        if i == EOS:
            break
        if i in (TPAD, BOS):
            continue
        out.append(itos[i])
    return cad.detokenize_script(out)


def crop_trailing(x: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """Drop script columns that are padding in every row (a causal model's earlier outputs do not depend on
    them and the loss ignores them): the same numbers on the kept positions, less compute."""
    nonpad = (x[:, prompt_len:] != TPAD).any(0)
    keep = int(torch.nonzero(nonpad).max()) + 1 if bool(nonpad.any()) else 1
    return x[:, : prompt_len + keep]


class RowLoader:
    def __init__(self, rows: torch.Tensor, batch: int, steps: int, seed: int):
        self.rows, self.batch, self.steps, self.seed = rows, batch, steps, seed

    def __len__(self):
        return self.steps

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed)
        for _ in range(self.steps):
            yield self.rows[torch.randint(0, self.rows.shape[0], (self.batch,), generator=g)]


@torch.no_grad()
def sample_scripts(model, prompts: torch.Tensor, script_len: int, temperature: float,
                   generator: torch.Generator | None) -> torch.Tensor:
    """(B, Lp) prompts -> (B, Ls) tokens (greedy when temperature == 0); EOS then padding."""
    cache = model.new_cache()
    logits = model(prompts, cache)[:, -1]
    B = prompts.shape[0]
    out = torch.full((B, script_len), TPAD, dtype=torch.long, device=prompts.device)
    done = torch.zeros(B, dtype=torch.bool, device=prompts.device)
    for t in range(script_len):
        if temperature == 0:
            nxt = logits.argmax(-1)
        else:
            probs = torch.softmax(logits / temperature, -1)
            nxt = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        nxt = torch.where(done, torch.full_like(nxt, TPAD), nxt)
        out[:, t] = nxt
        done |= nxt == EOS
        if bool(done.all()) or t == script_len - 1:
            break
        logits = model(nxt[:, None], cache)[:, -1]
    return out


class ScriptPolicy(nn.Module):
    """GRPO policy over scripts: prompts are (P, Lp + 1) rows (last column: program row id). The policy is the
    model at ``temperature`` τ: rollouts sample from softmax(logits/τ) and token_logprobs score that same
    distribution (so the importance ratios compare like with like)."""

    def __init__(self, model, prompt_len: int, script_len: int, logprob_fn, temperature: float = 1.0):
        super().__init__()
        self.model, self.prompt_len, self.script_len = model, prompt_len, script_len
        self.logprob_fn, self.temperature = logprob_fn, temperature

    def rollout(self, prompts, group_size, generator):
        p = prompts[:, : self.prompt_len].repeat_interleave(group_size, 0)
        rid = prompts[:, -1].repeat_interleave(group_size, 0)
        comp = sample_scripts(self.model, p, self.script_len, self.temperature, generator)
        mask = torch.ones_like(comp, dtype=torch.float)
        ended = torch.cumsum((comp == EOS).long(), 1)
        mask = torch.where((ended - (comp == EOS).long()) > 0, torch.zeros_like(mask), mask)  # up to EOS inclusive
        mask = mask * (comp != TPAD).float()
        return {"tokens": torch.cat([p, comp], 1), "mask": mask, "rid": rid}

    def token_logprobs(self, roll):
        full = roll["tokens"]
        x = crop_trailing(full, self.prompt_len)
        logits = self.model(x[:, :-1])[:, self.prompt_len - 1:]                 # (B, Ls', V)
        if self.temperature != 1.0:
            logits = logits / self.temperature
        lp = self.logprob_fn(logits, x[:, self.prompt_len:])
        pad = full.shape[1] - x.shape[1]                                        # all-pad tail: log-prob 0, mask 0
        return F.pad(lp, (0, pad)) if pad else lp


def np_seed(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)
