"""quantifier_eval: Triton (interpreted) == torch reference == plain Python loops, exactly."""
from __future__ import annotations

import pytest
import torch

from kernels.quantifier_eval import (BENCHMARKS, BENCHMARKS_SMALL, MODES, guarded_quantify,
                                     guarded_quantify_reference, random_inputs)


def _python_loops(rel, phi, dom, mode):
    G, W, D = rel.shape
    C = phi.shape[0]
    out = torch.zeros(G, C, W, dtype=torch.int32)
    for g in range(G):
        for c in range(C):
            for w in range(W):
                size = int(dom[w]).bit_length()
                bits = 0
                for x in range(size):
                    row = [(int(rel[g, w, x]) >> y) & 1 for y in range(size)]
                    val = [(int(phi[c, w]) >> y) & 1 for y in range(size)]
                    if mode == "exists":
                        hit = any(r and v for r, v in zip(row, val))
                    else:
                        hit = all((not r) or v for r, v in zip(row, val))
                    bits |= int(hit) << x
                out[g, c, w] = bits
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (3, 7, 5, 6), (2, 33, 3, 8), (4, 5, 2, 31)])
def test_reference_matches_python_loops(mode, shape):
    rel, phi, dom = random_inputs(*shape, seed=sum(shape))
    assert torch.equal(guarded_quantify_reference(rel, phi, dom, mode), _python_loops(rel, phi, dom, mode))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (3, 97, 7, 6), (10, 65, 17, 8), (2, 130, 33, 31), (5, 1, 70, 5)])
def test_triton_equals_reference_exactly(mode, shape):
    rel, phi, dom = random_inputs(*shape, seed=None)          # fresh random inputs every run
    got = guarded_quantify(rel, phi, dom, mode, backend="triton")
    assert got.dtype == torch.int32 and got.shape == (shape[0], shape[1], shape[2])
    assert torch.equal(got, guarded_quantify_reference(rel, phi, dom, mode))
    assert torch.equal(got & ~dom[None, None, :], torch.zeros_like(got))   # no bits outside the domain


def test_forall_is_not_exists_not():
    rel, phi, dom = random_inputs(3, 40, 6, 7, seed=3)
    forall = guarded_quantify(rel, phi, dom, "forall", backend="triton")
    exists_not = guarded_quantify(rel, ~phi & dom[None], dom, "exists", backend="triton")
    assert torch.equal(forall, ~exists_not & dom[None, None])


def test_empty_and_bad_inputs():
    rel, phi, dom = random_inputs(2, 3, 4, 5, seed=0)
    assert guarded_quantify(rel, phi[:0], dom).shape == (2, 0, 4)
    with pytest.raises(ValueError, match="mode"):
        guarded_quantify(rel, phi, dom, "most")
    with pytest.raises(ValueError, match="world axis"):
        guarded_quantify(rel, phi[:, :3], dom)
    with pytest.raises(ValueError, match="int32"):
        guarded_quantify(rel.long(), phi, dom)
    big = torch.zeros(1, 4, 32, dtype=torch.int32)
    with pytest.raises(ValueError, match="bit-packing limit"):
        guarded_quantify(big, phi, dom)


def test_benchmark_cases_are_well_formed():
    for cases in (BENCHMARKS, BENCHMARKS_SMALL):
        for name, make, kern, ref, nbytes, flops in cases:
            assert name.startswith("quantifier_eval") and nbytes > 0 and flops > 0
    name, make, kern, ref, *_ = BENCHMARKS_SMALL[0]
    inputs = make("cpu")
    kern(*inputs)
    ref(*inputs)
