"""Shared by futurecad's unit tests: hand-sized parts with seeded random primitive tensors (no CAD kernel)."""
from __future__ import annotations

import torch

from stages.futurecad import cad


def random_part(nf: int, ne: int, seed: int, face_scale: float = 1.0, edge_scale: float = 1.0) -> dict:
    """One part's primitive tensors: nf faces on the UV grid, ne edge curves (N(0, scale²) values), random types."""
    g = torch.Generator().manual_seed(seed)
    return {"faces": torch.randn(nf, cad.UV * cad.UV, cad.FACE_CH, generator=g) * face_scale,
            "edges": torch.randn(ne, cad.CURVE, cad.EDGE_CH, generator=g) * edge_scale,
            "face_type": torch.randint(0, len(cad.FACE_TYPES), (nf,), generator=g),
            "edge_type": torch.randint(0, len(cad.EDGE_TYPES), (ne,), generator=g)}
