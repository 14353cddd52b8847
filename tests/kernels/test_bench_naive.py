"""kernels/bench.py's table and kernels/naive.py's baselines: every kernel has a naive baseline,
each computes what its reference computes (outputs equal; for averaged losses, gradients equal up to
one positive factor), the CPU table runs and says why the CUDA columns are absent, and the CUDA
branch's roofline arithmetic (device peak lookup, bandwidth fraction) is right on a synthetic row."""
from __future__ import annotations

import importlib

import pytest
import torch

from kernels.bench import bench_case, kernel_modules, main, output_tensors, peak_bandwidth, table
from kernels.naive import NAIVE, PerItem, naive_baseline

SMALL_CASES = [(name, case) for name, module in kernel_modules() for case in module.BENCHMARKS_SMALL]


def test_every_kernel_has_a_naive_baseline():
    assert {name for name, _ in kernel_modules()} <= set(NAIVE)


def _leaves(inputs):
    return [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad and x.is_leaf]


# wrappers that return None: compare the function they time instead
def _quantify(mode):
    from kernels.quantifier_eval import guarded_quantify
    return lambda rel, phi, dom: guarded_quantify(rel, phi, dom, mode, backend="torch")


def _segmented(proto, actual, seg, k):
    from kernels.segmented_compare import segmented_compare
    return segmented_compare(proto, actual, seg, k, backend="torch")


@pytest.mark.parametrize("name,case", SMALL_CASES, ids=[c[0] for _, c in SMALL_CASES])
def test_naive_computes_what_the_reference_computes(name, case):
    label, make, _kern, ref, _nbytes, _flops = case
    inputs = make("cpu")
    if name == "quantifier_eval":
        ref = _quantify(label.split()[1])
    elif name == "segmented_compare":
        ref = _segmented
    naive = naive_baseline(name, ref)
    spec = NAIVE[name]
    if isinstance(spec, PerItem):  # at most 5 items: the naive loop is slow by design
        idx = spec.items(inputs)
        inputs = tuple((x.narrow(spec.dim, 0, min(5, x.shape[spec.dim])).detach().clone().requires_grad_(x.requires_grad)
                        if j in idx else x) for j, x in enumerate(inputs))
    leaves = _leaves(inputs)
    want = ref(*inputs)
    if leaves:  # forward + backward of a loss: compare gradients
        g_ref = torch.cat([x.grad.flatten() for x in leaves])
        for x in leaves:
            x.grad = None
        naive(*inputs)
        g_naive = torch.cat([x.grad.flatten() for x in leaves])
        scale = (g_naive @ g_ref) / (g_ref @ g_ref)
        assert scale > 0 and g_ref.abs().max() > 0
        torch.testing.assert_close(g_naive, scale * g_ref, atol=1e-5, rtol=1e-4)
    else:
        got = naive(*inputs)
        flat_want, flat_got = output_tensors(want), output_tensors(got)
        assert flat_want and len(flat_want) == len(flat_got)
        for w, g in zip(flat_want, flat_got):
            torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-5, equal_nan=True)


def test_per_item_slices_only_the_item_arguments():
    calls = []

    def ref(x, shared):
        calls.append((tuple(x.shape), tuple(shared.shape)))
        return x * shared.sum()

    x, shared = torch.arange(6.0).view(3, 2), torch.ones(4)
    torch.testing.assert_close(PerItem((0,))(ref)(x, shared), x * 4)
    assert calls == [((1, 2), (4,))] * 3
    cols = PerItem((0,), dim=1)(lambda m: m * 2)(x)
    torch.testing.assert_close(cols, x * 2)


def test_cpu_table_reports_naive_ratio_and_why_cuda_columns_are_absent(capsys, tmp_path, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("this checks the CPU table")
    import kernels.bench as bench
    monkeypatch.setattr(bench, "interpreting", lambda: False)  # as `make bench` runs: no interpreter
    main(["--only", "token_logprob", "chamfer", "--reps", "1", "--json", str(tmp_path / "rows.json")])
    out = capsys.readouterr().out
    assert "| kernel" in out and "naive/torch" in out and "% peak BW" in out
    assert "token_logprob" in out and "chamfer" in out
    assert "Triton columns skipped: no CUDA device here" in out
    assert "GB/s and % peak BW skipped: no CUDA device" in out
    import json
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert {r["kernel"] for r in rows} == {"token_logprob", "chamfer"}
    assert all(r["naive_s"] > 0 and r["ratio_naive_over_reference"] > 0 and "kernel_s" not in r for r in rows)
    with pytest.raises(SystemExit):
        main(["--only", "no_such_kernel"])


def test_cuda_roofline_arithmetic(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    assert peak_bandwidth("cuda", None)[0] == 4800.0
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    assert peak_bandwidth("cuda", None)[0] == 3350.0
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Mystery GPU")
    assert peak_bandwidth("cuda", None)[0] is None
    assert peak_bandwidth("cuda", 1000.0)[0] == 1000.0
    assert peak_bandwidth("cpu", None) == (None, "no CUDA device")
    # the CUDA branch of bench_case, with time_fn stubbed: 2 GB in 1 ms = 2000 GB/s = 50% of 4000 GB/s
    import kernels.bench as bench
    monkeypatch.setattr(bench, "time_fn", lambda fn, inputs, device, reps: 1e-3 if fn == "k" else 4e-3)
    case = ("toy", lambda device: (), "k", "r", 2e9, 3e12)
    row = bench_case("toy", case, "cuda", 1, True, False, 4000.0, 1000.0)
    assert row["ratio_kernel_over_reference"] == pytest.approx(0.25)
    assert row["achieved_gbs"] == pytest.approx(2000.0) and row["bandwidth_fraction"] == pytest.approx(0.5)
    assert row["flop_fraction"] == pytest.approx(3.0)
    assert "50.0%" in table([row]) and "| 0.25" in table([row])


def test_parity_column_measures_the_kernels_deviation():
    """bench's parity: outputs and input gradients of kernel vs reference on the case's own inputs. A planted
    wrong kernel (output ×1.01, or a wrong gradient in a fwd+bwd case) shows its deviation; an exact one 0."""
    from kernels.bench import parity

    x = torch.linspace(-2.0, 3.0, 12).view(3, 4).requires_grad_(True)
    w = torch.full((4,), 0.7)
    ref = lambda x, w: (x * w).tanh()                                        # noqa: E731
    assert parity(ref, ref, (x, w)) == {"max_abs_err": 0.0, "rel_err": 0.0}
    off = parity(lambda x, w: ref(x, w) * 1.01, ref, (x, w))
    want = float((ref(x, w) * 0.01).abs().max())                              # the gradients differ by 1% too
    assert off["max_abs_err"] >= want * 0.999 and 0.005 < off["rel_err"] < 0.02

    def fwd_bwd(scale):
        def run(x, w):
            (ref(x, w) * scale).sum().backward()                               # returns None: grads in x.grad
        return run
    assert parity(fwd_bwd(1.0), fwd_bwd(1.0), (x, w))["max_abs_err"] == 0.0
    bad = parity(fwd_bwd(1.5), fwd_bwd(1.0), (x, w))
    assert bad["rel_err"] == pytest.approx(0.5 / 1.0, rel=1e-6)
    assert x.grad is None                                                     # the case's own inputs untouched
    ints = torch.arange(5)
    assert parity(lambda a: a + 1, lambda a: a + 1, (ints,)) == {"max_abs_err": 0.0, "rel_err": 0.0}
    assert parity(lambda a: a + 2, lambda a: a + 1, (ints,))["max_abs_err"] == float("inf")
