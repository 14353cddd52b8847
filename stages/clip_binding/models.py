"""Scene and probe encoders (official models.py:84-175) and the contrastive LightningModule.

    scene_emb = SceneEncoder(tokens)       # pre-LN bidirectional transformer, EOS state -> Linear -> d_out
    probe_emb = ProbeEncoder(query tokens) # same architecture, separate weights
    logits    = min(exp(τ), 10) · cos(scene_emb, probe_emb)        # τ learnable, τ0 = 1.15
    loss      = softCE(concept queries) + softCE(object queries)   # kernels.cosine_soft_ce

Budgets are step counts; each batch is drawn inside the step from the module's own seeded generator
(scenes use only training objects; swap negatives may be any object, as the official code reads).
"""
from __future__ import annotations

import math

import lightning as L
import torch
from torch import nn

from kernels.cosine_soft_ce import cosine_soft_ce, cosine_soft_ce_mean
from stages.clip_binding.scenes import World, pooled_queries, sample_scenes

TAU0, SCALE_MAX = 1.15, 10.0


def sinusoidal(n: int, d: int) -> torch.Tensor:
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    pe = torch.zeros(n, d)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq[: d // 2])
    return pe


class Encoder(nn.Module):
    """Token embedding + sinusoidal PE -> pre-LN TransformerEncoder (no final LN) -> EOS -> Linear."""

    def __init__(self, vocab: int, d_model: int, n_heads: int, n_layers: int, d_ff: int, d_out: int,
                 max_len: int, activation: str = "gelu", xavier_init: bool = True):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.register_buffer("pe", sinusoidal(max_len, d_model), persistent=False)
        layer = nn.TransformerEncoderLayer(d_model, n_heads, d_ff, dropout=0.0, batch_first=True, norm_first=True,
                                           activation=activation)         # official models.py: GELU
        self.enc = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, d_out)
        if xavier_init:                       # official models.py: xavier_uniform_ on every parameter with dim > 1
            for p in self.parameters():
                if p.dim() > 1:
                    nn.init.xavier_uniform_(p)

    def forward(self, tokens: torch.Tensor, eos: torch.Tensor, pad: int) -> torch.Tensor:
        T = tokens.shape[1]
        h = self.tok(tokens) + self.pe[:T]                                    # (B, T, d)
        h = self.enc(h, src_key_padding_mask=tokens == pad)                   # bidirectional
        return self.head(h[torch.arange(tokens.shape[0], device=tokens.device), eos])   # (B, d_out)


class BindingModel(L.LightningModule):
    """ALGO: scene/probe encoders trained with soft CE over concept + object queries (train_clean.py)."""

    def __init__(self, world: World, train_objects: torch.Tensor, d_model: int, n_heads: int, n_layers: int,
                 d_ff: int, d_out: int, batch_size: int, lr: float, weight_decay: float, warmup: float,
                 steps: int, seed: int, backend: str = "torch", heldout_negatives: bool = False,
                 curve_every: int = 0, curve_scenes: int = 256, activation: str = "gelu", xavier_init: bool = True):
        super().__init__()
        self.world = world
        self.register_buffer("train_objects", train_objects.clone(), persistent=False)
        arch = dict(activation=activation, xavier_init=xavier_init)
        self.scene_enc = Encoder(world.vocab, d_model, n_heads, n_layers, d_ff, d_out, world.scene_len, **arch)
        self.probe_enc = Encoder(world.vocab, d_model, n_heads, n_layers, d_ff, d_out, world.k + 3, **arch)
        self.tau = nn.Parameter(torch.tensor(TAU0))
        self.hp = dict(batch_size=batch_size, lr=lr, weight_decay=weight_decay, warmup=warmup, steps=steps)
        self.seed, self.backend, self.heldout_negatives = seed, backend, heldout_negatives
        self.gen: torch.Generator | None = None
        self.kernel_calls = 0
        self.history: list[dict] = []
        self.curve_every, self.curve_scenes = curve_every, curve_scenes

    def scale(self) -> torch.Tensor:
        return torch.clamp(torch.exp(self.tau), max=SCALE_MAX)        # min(exp(τ), 10)

    def embed_scenes(self, objs: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        tokens, eos = self.world.tokenize_scenes(objs, n)
        return self.scene_enc(tokens, eos, self.world.PAD)

    def embed_concepts(self) -> torch.Tensor:
        q = self.world.concept_queries(self.tau.device)
        return self.probe_enc(q, torch.full((q.shape[0],), 1, device=q.device), self.world.PAD)

    def embed_objects(self, obj: torch.Tensor) -> torch.Tensor:
        q = self.world.object_queries(obj)
        return self.probe_enc(q, torch.full((q.shape[0],), self.world.k + 2, device=q.device), self.world.PAD)

    def embed_queries(self, obj: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Concept and object queries in ONE probe-encoder call (concept queries PAD-ed to k+3)."""
        w = self.world
        cq = w.concept_queries(obj.device)
        cq = torch.cat([cq, torch.full((cq.shape[0], w.k + 1), w.PAD, device=obj.device, dtype=torch.long)], 1)
        oq = w.object_queries(obj)
        eos = torch.cat([torch.ones(cq.shape[0], dtype=torch.long, device=obj.device),
                         torch.full((oq.shape[0],), w.k + 2, dtype=torch.long, device=obj.device)])
        emb = self.probe_enc(torch.cat([cq, oq]), eos, w.PAD)
        return emb[: cq.shape[0]], emb[cq.shape[0]:]

    def batch_losses(self, objs, n, gen, backend, negative_pool=None) -> dict[str, torch.Tensor]:
        pq = pooled_queries(self.world, objs, n, gen, negative_pool)
        x = self.embed_scenes(objs, n)                                                  # (B, d_out)
        qc, qo = self.embed_queries(pq["query_objs"])
        s = self.scale()
        # ALGO: soft cross-entropy to multi-hot / row-sum targets, concept + object queries summed
        lc = cosine_soft_ce_mean(x, qc, pq["concept_labels"], s, backend=backend)
        lo = cosine_soft_ce_mean(x, qo, pq["object_labels"], s, backend=backend)
        self.kernel_calls += 2
        return {"loss": lc + lo, "concept_loss": lc, "object_loss": lo}

    def on_train_start(self) -> None:
        self.gen = torch.Generator(device=self.device)
        self.gen.manual_seed(self.seed)

    def training_step(self, batch, batch_idx):
        objs, n = sample_scenes(self.world, self.train_objects, self.hp["batch_size"], self.gen)
        pool = None if self.heldout_negatives else self.train_objects
        out = self.batch_losses(objs, n, self.gen, self.backend, pool)
        self.log_dict({f"train/{k}": v for k, v in out.items()}, prog_bar=False)
        last = batch_idx == self.hp["steps"] - 1
        if batch_idx % 50 == 0 or last or (self.curve_every and batch_idx % self.curve_every == 0):
            row = {"step": batch_idx, **{k: float(v.detach()) for k, v in out.items()},
                   "scale": float(self.scale().detach())}
            if self.curve_every and (batch_idx % self.curve_every == 0 or last):
                row["seen_binding_acc"] = self.seen_binding_acc()
                row["seen_recomb_acc"] = self.seen_recomb_acc()
            self.history.append(row)
        return out["loss"]

    @torch.no_grad()
    def seen_binding_acc(self) -> float:
        """Learning curve: the evaluate stage's binding score on a FIXED set of `curve_scenes` 2-object
        scenes of this model's TRAINING objects (own generator: the training stream is untouched)."""
        g = torch.Generator(device=self.device).manual_seed(10_000 + self.seed)
        objs, n = sample_scenes(self.world, self.train_objects, self.curve_scenes, g, n_fixed=min(2, self.world.n_max))
        pool = None if self.heldout_negatives else self.train_objects
        r = heldout_accuracy(self, objs, n, g, self.backend, pool)
        self.kernel_calls += 2
        two = objs[:, 0] != objs[:, -1] if self.world.n_max > 1 else n > 0
        return float(r["object_correct"][two].float().mean())

    @torch.no_grad()
    def seen_recomb_acc(self) -> float:
        """Learning curve: the strict ``recombination_accuracy`` on a fixed set of at most ``curve_scenes``
        ``seen_pair_scenes`` (nan when there are none)."""
        g = torch.Generator(device=self.device).manual_seed(10_000 + self.seed)
        pairs = seen_pair_scenes(self.world, self.train_objects, self.curve_scenes, g)
        return float(recombination_accuracy(self, pairs)["strict"].float().mean()) if len(pairs) else float("nan")

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hp["lr"], weight_decay=self.hp["weight_decay"])
        steps, warm = self.hp["steps"], max(1, int(self.hp["warmup"] * self.hp["steps"]))

        def lr_at(step: int) -> float:  # 10% linear warmup, then linear decay (official schedule)
            return (step + 1) / warm if step < warm else max(0.0, (steps - step) / max(1, steps - warm))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


@torch.no_grad()
def heldout_accuracy(model: BindingModel, objs: torch.Tensor, n: torch.Tensor, gen: torch.Generator,
                     backend: str, negative_pool: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """ALGO: accuracy = min positive logit > max negative logit over the batch's pooled queries
    (official train_clean.py:44-56), per scene, for concept and object queries. `negative_pool`: swap
    negatives only from these objects (the training distribution when heldout_negatives is off)."""
    pq = pooled_queries(model.world, objs, n, gen, negative_pool)
    x = model.embed_scenes(objs, n)
    s = model.scale()
    qc, qo = model.embed_queries(pq["query_objs"])
    _, cmin, cmax = cosine_soft_ce(x, qc, pq["concept_labels"], s, backend=backend)
    _, omin, omax = cosine_soft_ce(x, qo, pq["object_labels"], s, backend=backend)
    return {"concept_correct": cmin > cmax, "object_correct": omin > omax, "inputs": (x, pq, s)}


def recombinations(world: World, o1: torch.Tensor, o2: torch.Tensor) -> torch.Tensor:
    """(B,), (B,) object ids -> (B, 2^k): object m takes concept c from o2 if bit c of m is set, else from o1
    (m = 0 is o1, m = 2^k - 1 is o2; m and its complement 2^k - 1 - m hold, together, the same bag of concept
    values as o1 and o2)."""
    v1, v2 = world.concepts(o1), world.concepts(o2)                                     # (B, k)
    bits = torch.tensor([[(m >> c) & 1 for c in range(world.k)] for m in range(2 ** world.k)], dtype=torch.bool,
                        device=o1.device)                                               # (2^k, k)
    vals = torch.where(bits[None], v2[:, None, :], v1[:, None, :])                      # (B, 2^k, k)
    return world.object_id(vals)


@torch.no_grad()
def recombination_accuracy(model: BindingModel, objs: torch.Tensor) -> dict[str, torch.Tensor]:
    """ALGO (binding test, this project's): 2-object scenes whose objects differ in EVERY concept. The scene's
    2^k recombination objects split into 2^(k-1) complementary pairs, each a 2-object scene with the SAME bag of
    concept values (for k = 2: (a1, b1) + (a2, b2) and (a1, b2) + (a2, b1)). A pair-scene passes when both its
    objects' probes outscore the other 2^k - 2 recombination probes (cosine; the positive logit scale does not
    change the order).
      lenient: the given scene passes (random scores: 1/C(2^k, 2), 1/6 at k = 2);
      strict:  every pair-scene of the bag passes — impossible for a scene encoder that sees only the bag of
               concepts (all pair-scenes then share one embedding), whatever the probe code (random: 1/36 at k = 2).
    The lenient test can be passed without binding when probe norms differ (an additive probe code with unequal
    norms); the strict one cannot. objs (B, 2) -> {"lenient": (B,) bool, "strict": (B,) bool}."""
    w = model.world
    vals = w.concepts(objs)                                                             # (B, 2, k)
    if not bool((vals[:, 0] != vals[:, 1]).all()):
        raise ValueError("recombination_accuracy: the scenes' two objects must differ in every concept")
    B, R = objs.shape[0], 2 ** w.k
    rec = recombinations(w, objs[:, 0], objs[:, 1])                                     # (B, R)
    _, qo = model.embed_queries(rec.flatten())
    qo = qo.view(B, R, -1)
    half = torch.arange(R // 2, device=objs.device)                                    # pair-scene j = (j, R-1-j)
    scenes = torch.stack([rec[:, half], rec[:, R - 1 - half]], -1).reshape(B * (R // 2), 2)
    x = model.embed_scenes(scenes, torch.full((scenes.shape[0],), 2, device=objs.device)).view(B, R // 2, 1, -1)
    cos = torch.nn.functional.cosine_similarity(x, qo[:, None], dim=-1)                # (B, R/2, R)
    own = torch.zeros(R // 2, R, dtype=torch.bool, device=objs.device)
    own[half, half] = True
    own[half, R - 1 - half] = True
    lo = cos.masked_fill(~own, float("inf")).min(-1).values
    hi = cos.masked_fill(own, float("-inf")).max(-1).values
    passed = lo > hi                                                                    # (B, R/2)
    return {"lenient": passed[:, 0], "strict": passed.all(-1)}


def seen_pair_scenes(world: World, train_objects: torch.Tensor, cap: int, gen: torch.Generator) -> torch.Tensor:
    """The seen-object scenes of the binding test: every unordered pair of training objects that differ in every
    concept AND whose recombinations are all training objects (so every pair-scene of its bag is a scene of
    training objects), each once (no replacement); a random subset of ``cap`` when there are more. -> (n, 2)."""
    if world.n_max < 2:
        return train_objects.new_zeros((0, 2))
    t = train_objects
    a, b = torch.triu_indices(len(t), len(t), offset=1, device=t.device)
    pairs = torch.stack([t[a], t[b]], 1)
    pairs = pairs[(world.concepts(pairs[:, 0]) != world.concepts(pairs[:, 1])).all(-1)]
    if len(pairs):
        pairs = pairs[torch.isin(recombinations(world, pairs[:, 0], pairs[:, 1]), t).all(-1)]
    if len(pairs) > cap:
        pairs = pairs[torch.randperm(len(pairs), generator=gen, device=t.device)[:cap]]
    return pairs


def steps_loader(steps: int):
    """Lightning needs an iterable: one dummy item per optimisation step (the batch is drawn in-step)."""
    return torch.utils.data.DataLoader(torch.arange(steps), batch_size=None, shuffle=False)

