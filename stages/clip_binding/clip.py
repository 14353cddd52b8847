"""The real-CLIP side of the complexity analysis (issue 42): a `transformers.CLIPModel` text tower embeds
captions of the concept world's scenes; the same regressors and frozen probes then run on them unchanged.

    caption(a, b) = "a <colour a> <shape a> and a <colour b> <shape b>"   (k = 2; k > 2 adds a size / material word)
    Y[a, b]      = CLIP text features of caption(a, b)                    (all ordered object pairs)
    probes[o]    = CLIP text features of "a <colour o> <shape o>"          (one per object)

`load_clip(SourceConfig)` reads a local checkpoint folder (or a cached / downloadable hub name, only under
the `full` profile and only where `stages.common.sources.resolve_ref` allows it; nothing downloads in
tests or the default profile). `tiny_clip` builds a randomly initialised CLIPModel from a config (tests).
The paper embeds rendered CLEVR-like images with CLIP's image tower; captions through the text tower are
the part of that pipeline that needs no renderer (a deviation stated in the report).
"""
from __future__ import annotations

from pathlib import Path

import torch

from stages.common.sources import SourceConfig, SourceError, resolve_ref
from stages.clip_binding.scenes import World

WORDS = (
    ("red", "green", "blue", "yellow", "purple", "orange", "brown", "gray", "pink", "cyan",
     "black", "white", "gold", "silver", "violet", "teal", "maroon", "navy", "olive", "beige"),
    ("cube", "sphere", "cylinder", "cone", "torus", "pyramid", "ring", "star", "disk", "prism",
     "block", "ball", "tube", "wedge", "arch", "cross", "heart", "moon", "plate", "rod"),
    ("small", "large", "tiny", "huge", "short", "tall", "thin", "thick", "flat", "round",
     "long", "wide", "narrow", "big", "little", "giant", "slim", "stout", "low", "high"),
    ("metal", "rubber", "wooden", "glass", "stone", "plastic", "paper", "clay", "steel", "cloth",
     "marble", "ivory", "copper", "bronze", "silk", "wax", "foam", "felt", "brick", "ice"),
)


def object_phrase(world: World, obj: int) -> str:
    """'a <size> <material> <colour> <shape>' with the concept values of object `obj` (k ≤ 4, v ≤ 20)."""
    vals = world.concepts(torch.tensor(obj)).tolist()
    words = [WORDS[c][vals[c]] for c in range(world.k)]
    order = [c for c in (2, 3, 0, 1) if c < world.k]          # size, material, colour, shape
    return "a " + " ".join(words[c] for c in order)


def scene_caption(world: World, a: int, b: int) -> str:
    return f"{object_phrase(world, a)} and {object_phrase(world, b)}"


def tiny_clip(seed: int, vocab_size: int, *, d: int = 32, proj: int = 16, max_len: int = 32):
    """A randomly initialised CLIPModel (text and vision towers) from a config: no download, seeded; the
    text tower pools at the first </s> (id 4), as real CLIP pools at its end-of-text token."""
    from transformers import CLIPConfig, CLIPModel

    cfg = CLIPConfig(text_config=dict(vocab_size=vocab_size, hidden_size=d, intermediate_size=2 * d,
                                      num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=max_len,
                                      bos_token_id=3, eos_token_id=4, pad_token_id=0),
                     vision_config=dict(hidden_size=d, intermediate_size=2 * d, num_hidden_layers=1,
                                        num_attention_heads=2, image_size=32, patch_size=16),
                     projection_dim=proj)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return CLIPModel(cfg).eval()


def load_clip(source: SourceConfig, key: str = "papers.clip_binding.evaluate.source"):
    """(CLIPModel, tokenizer) from a local checkpoint folder or a hub name (resolve_ref: refused with one
    line naming `key` when it is not local/cached and the hub is offline)."""
    from transformers import AutoTokenizer, CLIPModel

    if source.kind == "toy" or source.model is None:
        raise SourceError(f"{key}: kind {source.kind} has no CLIP model (set kind: hf and model under profiles.full)")
    r = resolve_ref(source.model, f"{key}.model", revision=source.revision)
    try:
        model = CLIPModel.from_pretrained(r.ref, revision=None if r.local else source.revision,
                                          local_files_only=r.local).eval()
        tok = AutoTokenizer.from_pretrained(source.tokenizer or r.ref, local_files_only=r.local)
    except (OSError, ValueError) as err:
        raise SourceError(f"{key}.model: {source.model} is not a CLIP checkpoint ({type(err).__name__}: "
                          f"{str(err).splitlines()[0][:200]})") from None
    return model, tok


@torch.no_grad()
def text_features(model, tokenizer, texts: list[str], batch: int = 256) -> torch.Tensor:
    """CLIP text features (projected, not normalised) of `texts`, in order."""
    dev = next(model.parameters()).device
    out = []
    for i in range(0, len(texts), batch):
        enc = tokenizer(texts[i:i + batch], padding=True, return_tensors="pt")
        enc = {k: v.to(dev) for k, v in enc.items() if k in ("input_ids", "attention_mask")}
        feats = model.get_text_features(**enc)
        out.append(getattr(feats, "pooler_output", feats).float())
    return torch.cat(out)


def clip_world(model, tokenizer, world: World, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Y (P, d): features of every scene caption (a[i], b[i]); probes (n_objects, d): one per object phrase."""
    Y = text_features(model, tokenizer, [scene_caption(world, int(x), int(y)) for x, y in zip(a, b)])
    P = text_features(model, tokenizer, [object_phrase(world, o) for o in range(world.n_objects)])
    return Y, P


def save_fixture(path: Path, seed: int = 0) -> Path:
    """A tiny CLIP checkpoint folder in the real `save_pretrained` layout (config.json + weights +
    tokenizer files), built at test time from a WordLevel tokenizer over the world's words."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1, "<spare>": 2, "<s>": 3, "</s>": 4, "a": 5, "and": 6}   # CLIP pools at </s>
    for words in WORDS:
        for w in words:
            vocab.setdefault(w, len(vocab))
    t = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 3), ("</s>", 4)])
    tok = PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                  unk_token="<unk>")
    model = tiny_clip(seed, len(vocab))
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
