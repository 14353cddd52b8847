"""Every paper's pipeline again on fresh seeds: which committed verdicts a new draw of the seeds keeps.

    python -m flows.replicate                    # every paper, one study each (~75 min on 2 cores), then the table
    python -m flows.replicate --papers sciql     # some papers (the table still covers every study folder there)
    python -m flows.replicate --table            # only the table, from the study folders already there

A paper's replication is a study (``stages.common.study``) that changes only the seed values in ``FRESH_SEEDS``
(checked: nothing else differs from the default): the seeds of the unit its findings repeat (the trained arms, the
simulated draws), replaced by seeds the default does not use. Code, budgets and thresholds stay as committed; what else a paper's study keeps on the committed draw (a
pretrained base, a judge, a data split) is in ``KEPT``. Each study goes to
``reports/studies/<slug>_fresh_seeds``; then ``flows.verdicts`` compares each with its paper's committed report
and the table (same verdicts, moves between holds and fails, every moved claim with both effects and t-bounds)
is written to ``reports/studies/replication.md``.

Why: training runs are deterministic on one machine, but a CPU with other float kernels (or any change of the
float order) gives new draws, and verdicts decided within seed noise move with them (README, *Results*). A
replication on fresh seeds measures that directly, on any machine.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from flows.proc import ROOT
from flows.verdicts import VerdictError, compare_study, format_studies
from stages.common.config import ConfigError, read_params, registered_papers
from stages.common.paths import atomic_write_text
from stages.common.study import apply_overrides, parse_override

# per paper: the overrides of its seed lists (stage.key=value, as `stages.common.study --set`)
FRESH_SEEDS: dict[str, list[str]] = {
    "backdoor_awareness": ["prepare.seeds=[3, 4, 5]"],
    "clip_binding": ["prepare.seeds=[3, 4, 5]"],
    "cv_stability": ["prepare.seed=2", "evaluate.seed=4", "evaluate.real_example.seed=5"],
    "fair_bandits": ["prepare.seeds=[5, 6, 7, 8, 9]"],
    "ftrl_potential": ["prepare.random_game_seeds=[3, 4, 5]", "train.start_seeds=[5, 6, 7, 8, 9]",
                       "train.tie_seeds=[5, 6, 7, 8, 9]"],
    "futurecad": ["prepare.seeds=[5, 6, 7, 8, 9]"],
    "induction": ["prepare.seeds=[3, 4, 5]"],
    "justgrpo": ["prepare.seeds=[5, 6, 7, 8, 9]"],
    "l2g_net": ["train.seeds=[5, 6, 7, 8, 9]"],
    "opus": ["train.seeds=[3, 4, 5]"],
    "plantain": ["prepare.seeds=[3, 4, 5]"],
    "reversal_curse": ["prepare.seeds=[3, 4, 5]"],
    "sciql": ["train.seeds=[3, 4, 5]"],
    "star_kv": ["train.seeds=[5, 6, 7, 8, 9]", "train.side_seeds=[5]"],
    "tgdt": ["train.seeds=[5, 6, 7, 8, 9]"],
    "thunderagent": ["prepare.seeds=[5, 6, 7, 8, 9]"],
    "unembed_rank": ["train.seeds=[3, 4, 5]", "train.extra_seeds=[3]", "train.saturation.seeds=[3, 4]"],
    "vision2web": ["prepare.seeds=[5, 6, 7, 8, 9]", "train.bug_sites.functional_seeds=[5]",
                   "train.bug_sites.visual_seeds=[5]",
                   "train.agents=[{name: oracle, kind: oracle, seeds: [5]}, {name: synth, kind: openai, "
                   "endpoint: 'local:synth'}, {name: template, kind: openai, endpoint: 'local:template'}]"],
    "walrus": ["train.seeds=[5, 6, 7, 8, 9]"],
}
# per paper: what its replication keeps on the committed draw, and what the new seeds also redraw (read from each
# paper's code by a reviewer; shown under the table so that "same verdict" is read with what could move)
KEPT: dict[str, str] = {
    "backdoor_awareness": "keeps the test split (`split_seed`)",
    "clip_binding": "keeps the evaluation and regressor-bank streams (keyed by the seed's position, not its value)",
    "cv_stability": "redraws the data, the stability draws and the real example's partitions",
    "fair_bandits": "redraws every run",
    "ftrl_potential": "keeps the deterministic games: 8 of its 12 claims draw nothing",
    "futurecad": "keeps the data split (`split_seed`); the environment grounder is the first new seed's",
    "induction": "keeps the production ranker (`train.seed`) and the upstream benchmark; redraws the instances",
    "justgrpo": "keeps the pretrained base (`pretrain.seed`) and the test split (`split_seed`)",
    "l2g_net": "keeps the graphs; redraws each seed's node split and the shared sparsified cut (the first seed's)",
    "opus": "keeps the data (`prepare.seed`) and the diagnostics (`evaluate.seed`)",
    "plantain": "keeps the data (`data_seed`) and the learned plan judge (`judge.seed`)",
    "reversal_curse": "redraws each seed's facts",
    "sciql": "keeps the datasets, the evaluation start states and the diagnostics (`prepare.seed`, `evaluate.seed`)",
    "star_kv": "keeps the corpus and the shared teacher (its seed 0)",
    "tgdt": "keeps the data (`prepare.seed`) and the zero-policy baseline (`evaluate.seed`)",
    "thunderagent": "keeps the burst workloads (`range(burst_seeds)`) and the pilot, engine and fit seeds",
    "unembed_rank": "keeps the corpus",
    "vision2web": "keeps the judge calibration; redraws the tasks",
    "walrus": "keeps the scenarios (`prepare.seed`)",
}
STUDIES = ROOT / "reports" / "studies"
TABLE = STUDIES / "replication.md"


def study_dir(slug: str, studies: Path = STUDIES) -> Path:
    return studies / f"{slug}_fresh_seeds"


def _default(params: dict, slug: str, override: str):
    stage, keys, _ = parse_override(override)
    node = params["papers"][slug][stage]
    for k in keys:
        node = node[k]
    return node


def _is_seed(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def seed_changes(old, new, path: str) -> list[tuple[str, object, object]]:
    """The (path, default, new) seed values an override changes; ConfigError where anything else differs (a
    replication changes seeds only). A seed value is a list of integer seeds (the same number of them: the design
    keeps its size) or, under a key named ``seed`` / ``*_seed``, one integer; a count such as ``n_seeds`` or
    ``burst_seeds: 20`` is not."""
    key = path.rsplit(".", 1)[-1]
    if "seed" in key and (old != new):
        if isinstance(old, list) and isinstance(new, list) and all(map(_is_seed, old + new)):
            if len(old) != len(new):
                raise ConfigError(f"{path}: {len(new)} seeds instead of {len(old)} (a replication keeps the "
                                  "number of seeds)")
            return [(path, old, new)]
        if key.endswith("seed") and _is_seed(old) and _is_seed(new):
            return [(path, old, new)]
        raise ConfigError(f"{path}: not a seed value ({old!r} -> {new!r}; a list of integer seeds, or one integer "
                          "under a key named seed)")
    if "seed" in key:
        return []
    if isinstance(old, dict) and isinstance(new, dict) and old.keys() == new.keys():
        return [c for k in old for c in seed_changes(old[k], new[k], f"{path}.{k}")]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [c for i, (a, b) in enumerate(zip(old, new)) for c in seed_changes(a, b, f"{path}[{i}]")]
    if old != new:
        raise ConfigError(f"{path}: not a seed value ({old!r} -> {new!r})")
    return []


def check_fresh_seeds(params: dict) -> None:
    """ConfigError unless every registered paper has an entry and each of its overrides names an existing key
    of that paper, changes seed values only, at least one, and gives each seeds the default does not use."""
    papers = registered_papers(params)
    missing = [s for s in papers if s not in FRESH_SEEDS]
    if missing:
        raise ConfigError(f"flows.replicate.FRESH_SEEDS: no entry for {', '.join(missing)}")
    for slug in papers:
        overrides = FRESH_SEEDS[slug]
        apply_overrides(params, slug, overrides)          # every key exists (ConfigError naming it otherwise)
        for text in overrides:
            where = f"flows.replicate.FRESH_SEEDS[{slug!r}]"
            stage, keys, value = parse_override(text)
            try:
                changes = seed_changes(_default(params, slug, text), value, ".".join([stage, *keys]))
            except ConfigError as err:
                raise ConfigError(f"{where}: {err}") from None
            if not changes:
                raise ConfigError(f"{where}: {text!r} changes no seed")
            for path, old, new in changes:
                old_set = set(old) if isinstance(old, list) else {old}
                new_set = set(new) if isinstance(new, list) else {new}
                if old_set & new_set:
                    raise ConfigError(f"{where}: {path} reuses default seeds {sorted(old_set & new_set)}")


def table_text(studies: Path = STUDIES, root: Path = ROOT, revision: str = "HEAD") -> str:
    """replication.md: what was run, then flows.verdicts' comparison of every fresh-seed study folder."""
    done = [study_dir(s, studies) for s in sorted(FRESH_SEEDS) if (study_dir(s, studies) / "study.json").is_file()]
    cmp = [compare_study(d, root, revision) for d in done]
    missing = sorted(s for s in FRESH_SEEDS if not (study_dir(s, studies) / "study.json").is_file())
    head = ("# Fresh-seed replication\n\n"
            "Each paper's default pipeline re-run as a study (`stages/common/study.py`) with only its seed values "
            "changed to seeds the default does not use (`flows/replicate.py`, `FRESH_SEEDS`, checked path by "
            "path): the same code, budgets and thresholds (what else each keeps on the committed draw is listed below "
            "the table). A verdict that "
            "moves here was decided by the draw of the seeds (and, where the committed report came from another "
            "CPU than the study, by the CPU's float kernels too: README, *Results*); a move between holds and "
            "fails contradicts the committed verdict. Regenerate: `python -m flows.replicate` (the studies, ~75 min "
            "on 2 cores) or `python -m flows.replicate --table` (this file from the study folders).\n\n")
    kept = "".join(f"\n- {c.paper}: {KEPT.get(c.paper, '(not recorded)')}" for c in cmp)
    tail = (("\n\nWhat each study keeps as committed, or redraws besides the seeds' own runs:" + kept) if kept else "")
    tail += f"\n\nNot run yet: {', '.join(missing)}\n" if missing else "\n"
    return head + format_studies(cmp, revision) + tail


def run_replications(papers: list[str], studies: Path = STUDIES) -> list[str]:
    """One study per paper in a process of its own; returns the papers whose study failed."""
    failed = []
    for slug in papers:
        cmd = [sys.executable, "-m", "stages.common.study", slug, "--out", str(study_dir(slug, studies))]
        for text in FRESH_SEEDS[slug]:
            cmd += ["--set", text]
        print(f"[replicate] {slug}: {' '.join(cmd[1:])}", flush=True)
        if subprocess.run(cmd, cwd=ROOT).returncode != 0:
            failed.append(slug)
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.replicate", description=__doc__.splitlines()[0])
    parser.add_argument("--papers", nargs="+", default=None, help="only these papers' studies")
    parser.add_argument("--table", action="store_true", help="only write the table from the existing studies")
    args = parser.parse_args(argv)
    try:
        params = read_params(ROOT / "params.yaml")
        check_fresh_seeds(params)
        registered = registered_papers(params)
        unknown = [p for p in args.papers or [] if p not in registered]
        if unknown:
            raise ConfigError(f"unknown paper {unknown[0]!r} (registered: {', '.join(registered)})")
        failed = [] if args.table else run_replications(args.papers or registered)
        text = table_text()
    except (ConfigError, VerdictError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    atomic_write_text(TABLE, text)
    print(text)
    if failed:
        print(f"replicate: the studies of {', '.join(failed)} failed (their errors are above)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
