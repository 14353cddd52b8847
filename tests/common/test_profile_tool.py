"""benchmarks/profile.py (make profile): py-spy's raw samples -> phases, kinds of code, top functions,
flame graph; bad arguments stop with one line, exit 2. (The py-spy run itself is exercised by
`make profile`; its committed outputs are reports/profiles/*.txt.)"""
from __future__ import annotations

import subprocess
import sys

from benchmarks.profile import category, main, parse_raw, phase, summarize
from stages.common.paths import ROOT

RAW = "\n".join([
    # 6 samples importing torch
    "process 1:\"python -m stages\";<module> (stages/__main__.py:20);_find_and_load (<frozen importlib._bootstrap>:1176);"
    "<module> (torch/__init__.py:10);dlopen (libc.so.6) 6",
    # 10 samples in a BLAS kernel under the stage's training step
    "process 1:\"python -m stages\";main (stages/__main__.py:90);run (stages/toy/train.py:12);"
    "forward (torch/nn/modules/linear.py:125);THPVariable_matmul (libtorch_python.so);"
    "at::native::mm (libtorch_cpu.so);mkl_blas_avx512_sgemm_kernel_0 (libtorch_cpu.so) 10",
    # 3 samples of dispatcher overhead, 5 of bytecode, 4 of GC, 2 of W&B
    "process 1:\"python -m stages\";main (stages/__main__.py:90);run (stages/toy/train.py:13);"
    "c10::Dispatcher::call (libtorch_cpu.so) 3",
    "process 1:\"python -m stages\";main (stages/__main__.py:90);run (stages/toy/train.py:14) 5",
    "process 1:\"python -m stages\";main (stages/__main__.py:90);load_yaml (stages/common/config.py:50);"
    "gc_collect_main (libpython3.11.so.1.0) 4",
    "process 1:\"python -m stages\";main (stages/__main__.py:90);stage_run (stages/common/tracking.py:40);"
    "init (wandb/sdk/wandb_init.py:900);epoll_wait (libc.so.6) 2",
    "process 1:\"python -m stages\";0x7f2a4f64524a (libc.so.6);gc_collect_main (libpython3.11.so.1.0) 5",
    "not a sample line",
])


def test_samples_are_classified_and_summarized(tmp_path):
    raw = tmp_path / "x.raw"
    raw.write_text(RAW + "\n")
    stacks = parse_raw(raw)
    assert sum(c for _, c in stacks) == 35 and len(stacks) == 7
    assert [phase(s)[:5] for s, _ in stacks] == ["impor", "stage", "stage", "stage", "stage", "W&B t", "unatt"]
    assert [category(s).split()[0] for s, _ in stacks] == ["libc", "torch", "torch", "Python", "Python", "libc", "Python"]
    assert category(stacks[1][0]).startswith("torch kernels") and category(stacks[2][0]).startswith("torch C++")
    text = summarize(stacks, ["# toy"])
    assert " 17.1%  imports" in text and " 62.9%  stage work" in text and "  5.7%  W&B" in text
    assert " 14.3%  unattributed" in text
    # stage work = 22 samples: kernels 10, dispatcher 3, interpreter 5, GC 4 -> Python 9/22, torch 13/22
    assert "Python (interpreter + GC + binding) 40.9%, torch ops (kernels + C++ overhead) 59.1%" in text
    assert " 28.6%  mkl_blas_avx512_sgemm_kernel_0 (libtorch_cpu.so)" in text
    assert " 51.4%  run (stages/toy/train.py)" in text  # one function over all its lines, inclusive


def test_from_raw_writes_txt_and_svg(tmp_path):
    raw = tmp_path / "x.raw"
    raw.write_text(RAW + "\n")
    assert main(["reversal_curse", "--from-raw", str(raw), "--out", str(tmp_path / "out")]) == 0
    txt = (tmp_path / "out" / "reversal_curse-train.txt").read_text()
    svg = (tmp_path / "out" / "reversal_curse-train.svg").read_text()
    assert txt.startswith("# Profile of `python -m stages train reversal_curse --profile smoke`")
    assert svg.startswith("<svg") and "mkl_blas_avx512_sgemm_kernel_0" in svg and svg.count("<rect") > 5


def test_bad_arguments_one_line_exit_2(tmp_path, capsys):
    for args, word in ((["opus", "--stage", "trian"], "stage"), (["opus", "--profile", "huge"], "profile"),
                       (["opus", "--from-raw", str(tmp_path / "missing.raw"), "--out", str(tmp_path / "out")], "from-raw")):
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert err.startswith(f"error: {word}") and err.strip().count("\n") == 0
    res = subprocess.run([sys.executable, "-m", "benchmarks.profile", "nope"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 2 and res.stderr.startswith("error: slug: unknown paper 'nope'")
    assert res.stderr.strip().count("\n") == 0
    assert not (tmp_path / "out").exists()
