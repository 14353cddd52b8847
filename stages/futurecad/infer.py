"""What a trained futurecad model answers with, without Lightning: the grounder's checkpoint loader, its
decision rule (select or abstain) and ``ModelGrounder`` (the CAD sandbox's environment grounder, the evaluate
and report stages, the grounding CLI), and ``ProgramScorer`` (generated scripts executed in the sandbox and
scored with the Chamfer kernel). The sandbox's worker processes import this module, not ``train``, so each
worker skips Lightning's import (~4.5 CPU-s)."""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

import numpy as np
import torch

from kernels.chamfer import chamfer_distance
from kernels.record import KernelRecord
from stages.futurecad import cad
from stages.futurecad.model import BRepGround, encode_query, known_words, pad_parts, predict

if TYPE_CHECKING:
    from stages.futurecad.sandbox import CadSandbox

EMPTY_KINDS = ("absent", "foreign", "nonsense", "absent_freetext", "external_absent")


def load_parts(prep) -> list[dict]:
    return torch.load(prep / "primitives.pt", weights_only=True)


def query_tensors(rows: list[dict], vocab: dict[str, int], max_words: int) -> torch.Tensor:
    return torch.tensor([encode_query(r["query"], vocab, max_words) for r in rows], dtype=torch.long)


def load_ground(path, device="cpu") -> tuple[BRepGround, dict]:
    """The checkpoint the CLI and evaluate load: (model, meta with vocab, sizes and thresholds)."""
    ck = torch.load(path, map_location=device, weights_only=True)
    meta = json.loads(ck["meta"])
    g = meta["ground"]
    net = BRepGround(len(meta["vocab"]), g["d_model"], g["n_heads"], g["text_layers"], g["fusion_layers"],
                     g["max_words"]).to(device)
    net.load_state_dict(ck["state"])
    return net.eval(), meta


def decide(face_scores, edge_scores, n_known: int, threshold: float, abstain_threshold: float) -> dict:
    """The grounder's answer: abstain ("no match") when no query word is known or the top score is below
    abstain_threshold; otherwise the primitives with σ(score) > threshold (faces and edges ids)."""
    top = max([float(x) for x in face_scores] + [float(x) for x in edge_scores] + [0.0])
    if n_known == 0:
        return {"abstained": True, "reason": "no query word is in the grounder's vocabulary", "top_score": top,
                "faces": [], "edges": []}
    if top < abstain_threshold:
        return {"abstained": True, "reason": f"top score {top:.3f} below the abstention threshold {abstain_threshold:g}",
                "top_score": top, "faces": [], "edges": []}
    return {"abstained": False, "reason": "", "top_score": top,
            "faces": [int(i) for i, s in enumerate(face_scores) if s > threshold],
            "edges": [int(i) for i, s in enumerate(edge_scores) if s > threshold]}


class ModelGrounder:
    """cad.Grounder backed by BRepGround-mini: (solid, query) -> edge ids (empty when it abstains)."""

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

    def answer(self, prims: cad.Primitives, query: str) -> dict:
        fs, es = self.scores(prims, query)
        g = self.meta["ground"]
        return dict(decide(fs, es, known_words(query, self.vocab), g.get("threshold", 0.5), g.get("abstain_threshold", 0.5)),
                    face_scores=fs, edge_scores=es)

    def __call__(self, solid, query: str) -> list[int]:
        return self.answer(cad.export_cached(solid), query)["edges"]


def _prim_dict(prims: cad.Primitives) -> dict:
    from stages.futurecad.prepare import prim_tensors

    return prim_tensors(prims)


# ----------------------------------------------------------------------------------------------
# program scoring (sandbox + Chamfer kernel)
# ----------------------------------------------------------------------------------------------
class ProgramScorer:
    """Scores generated scripts against program targets: executes (sandbox), normalised CD (kernel)."""

    def __init__(self, sandbox: CadSandbox, points: torch.Tensor, diags: list[float], rec: KernelRecord, device,
                 breps: list[bytes] | None = None):
        self.sandbox, self.points, self.diags, self.rec, self.device = sandbox, points, diags, rec, device
        self.breps = breps

    def score(self, texts: list[str], rids: list[int], iou: bool = False) -> dict[str, torch.Tensor]:
        res = self.sandbox.run_many(texts, [self.breps[i] for i in rids] if iou else None)
        ok = [i for i, r in enumerate(res) if r["ok"]]
        n = len(texts)
        out = {"reward": torch.zeros(n), "ncd": torch.ones(n), "exec": torch.zeros(n), "iou": torch.zeros(n)}
        if ok:
            x = torch.from_numpy(np.stack([res[i]["points"] for i in ok])).to(self.device)
            y = self.points[[rids[i] for i in ok]].to(self.device)
            cd = self.rec.call("chamfer", chamfer_distance, x, y).cpu()
            diag = torch.tensor([self.diags[rids[i]] for i in ok])
            nc = torch.clamp(cd / diag, max=1.0)                               # ALGO: normalised Chamfer distance
            out["ncd"][ok] = nc
            out["reward"][ok] = 1.0 - nc                                        # ALGO: executes × (1 − nCD)
            out["exec"][ok] = 1.0
            if iou:
                out["iou"][ok] = torch.tensor([float(res[i]["iou"]) for i in ok])
        out["errors"] = [r["error"] for r in res]
        return out
