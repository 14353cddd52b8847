"""Issue 40: every file-reading CLI, fed inputs this project never wrote (missing, empty, binary, a 100k-deep
nesting, a 5,000-digit integer, NaN, a folder, the wrong JSON type), answers with one line on stderr and exit
code 2, writes nothing and raises no traceback. The CLIs run in-process through their ``main(argv)``."""
from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

HOSTILE = {
    "missing": None,
    "empty": "",
    "binary": os.urandom(2048) + b"\x00",
    "deep": "[" * 100_000 + "]" * 100_000,
    "deep_line": '{"id": "a", "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n",
    "bigint": '{"id": "a", "n": ' + "9" * 5000 + "}\n",
    "nan": '{"id": "a", "n": NaN}\n',
    "wrong_type": "[1, 2, 3]\n",
}

# module -> argv for an input path (file-taking CLIs), and for folder-taking CLIs the file inside the folder
FILE_CLIS = {
    "fair_bandits.simulate": lambda f, out: ["--scm", f, "--horizon", "10", "--seeds", "1", "--out", out],
    "induction.check": lambda f, out: ["--instances", f, "--predictions", f, "--out", out],
    "induction.solve": lambda f, out: ["--instances", f, "--out", out],
    "thunderagent.simulate": lambda f, out: ["--workload", f, "--policy", "thunderagent", "--out", out],
    "thunderagent.replay": lambda f, out: ["--proxy", "http://127.0.0.1:9", "--workload", f, "--out", out],
}
FOLDER_CLIS = {  # (file the folder must hold, argv for the folder)
    "thunderagent.official_trace": ("inst1/prefix_cache_metrics.jsonl", lambda d, out: [d, "--out", out]),
    "vision2web.verify": ("workflow.json", lambda d, out: ["--task", d, "--site", d, "--out", out]),
}


def _write(path: Path, content) -> None:
    if content is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)


def _assert_one_line_exit_2(module: str, argv: list[str], out: Path, capsys, names: str) -> None:
    main = importlib.import_module(f"stages.{module}").main
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as stop:  # argparse-level refusals exit through SystemExit
        rc = stop.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, (module, rc, err[-3:])
    assert 1 <= len(err) <= 2 and not any("Traceback" in line for line in err), err[-5:]
    assert not out.exists(), f"{module} wrote {out} on bad input"
    assert names in err[-1], f"{module}: the refusal does not name the input ({err[-1]})"


@pytest.mark.parametrize("kind", sorted(HOSTILE))
@pytest.mark.parametrize("module", sorted(FILE_CLIS))
def test_file_cli_refuses_hostile_input_in_one_line(tmp_path, capsys, module, kind):
    f = tmp_path / "input.json"
    _write(f, HOSTILE[kind])
    (tmp_path / "out").mkdir()                    # a valid output place: the refusal must be about the input
    out = tmp_path / "out" / "result.json"
    _assert_one_line_exit_2(module, FILE_CLIS[module](f, out), out, capsys, "input.json")


@pytest.mark.parametrize("kind", sorted(HOSTILE))
@pytest.mark.parametrize("module", sorted(FOLDER_CLIS))
def test_folder_cli_refuses_hostile_file_inside_in_one_line(tmp_path, capsys, module, kind):
    inner, argv = FOLDER_CLIS[module]
    d = tmp_path / "given"
    d.mkdir()
    _write(d / inner, HOSTILE[kind])
    out = tmp_path / "out"
    _assert_one_line_exit_2(module, argv(d, out), out, capsys, Path(inner).name if HOSTILE[kind] is not None else "given")
