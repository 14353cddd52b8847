"""One paper's pipeline as a Prefect flow: each stage is a task running ``dvc repro -s <stage>@<slug>``.

    python -m flows.paper_flow reversal_curse                      # in this checkout
    python -m flows.paper_flow reversal_curse --remote /mnt/dvc    # share outputs + run-cache

DVC decides what reruns (its lock file and run-cache); Prefect adds retries, logs (every output
line of DVC and the stage is streamed to the task's log) and the UI. When the checkout has a DVC
remote (``make remote REMOTE=...``, or ``remote=`` here), the flow checks it first (failing fast,
naming it), pulls outputs and the run-cache before the stages (``dvc pull --run-cache`` and
``dvc repro --pull``) and pushes each stage's outputs and run-cache entry as soon as that stage
succeeded (``dvc push --run-cache <stage>``), so a stage computed by one worker is restored, not
recomputed, by another — and a stage that dies midway pushes nothing (its outputs only appear,
atomically, when it completes; the push only follows a completed ``dvc repro``).

Artifacts: ``<slug>-report`` (markdown: reports/<slug>/report.md) and ``<slug>-claims`` (table:
each claim's verdict and numbers, plus per-stage runtimes).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # a bad slug/profile is one line and exit 2 in well under 2 s: before Prefect loads
    from flows.precheck import precheck_paper_cli

    precheck_paper_cli(sys.argv[1:])

from prefect import flow, get_run_logger, task  # noqa: E402
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from flows import remote as dvc_remote
from flows.api import ServeError, check_configured_api
from flows.proc import ROOT, CommandFailed, dvc, run_streaming
from flows.verdicts import verdict_of

STAGES = ("prepare", "train", "evaluate", "report")
STAGE_TIMEOUT_S = 3 * 3600

# DVC's own words for what it did with a stage (dvc/stage/__init__.py, dvc/repo/reproduce.py)
_DVC_STATUS = (
    ("is cached - skipping run", "restored"),   # run-cache hit: outputs checked out, cmd not run
    ("didn't change, skipping", "unchanged"),   # dvc.lock matches the workspace
    ("Running stage", "ran"),
)


def artifact_key(slug: str, what: str) -> str:
    """Prefect artifact keys allow only lowercase letters, digits and dashes."""
    return re.sub(r"[^a-z0-9-]+", "-", f"{slug}-{what}".lower())


def dvc_status(output: str, target: str) -> str:
    """What DVC reported doing with ``target``, read from its own log lines."""
    for line in output.splitlines():
        if f"'{target}'" not in line:
            continue
        for needle, status in _DVC_STATUS:
            if needle in line:
                return status
    return "unknown"


def _retry_unless_bad_config(task, task_run, state) -> bool:
    """A stage that exits 2 (bad params / missing input) fails the same way every time: no retry."""
    try:
        exc = state.result(raise_on_failure=False)
    except Exception:
        return True
    return not (isinstance(exc, CommandFailed) and "exited with 2" in exc.tail)


@task(name="dvc-repro", task_run_name="{stage}@{slug}", retries=1, retry_delay_seconds=5,
      retry_condition_fn=_retry_unless_bad_config, cache_policy=NO_CACHE, persist_result=False)
def repro_stage(stage: str, slug: str, root: str, sync: bool = False,
                timeout_s: float = STAGE_TIMEOUT_S) -> dict[str, Any]:
    """``dvc repro --single-item [--pull] <stage>@<slug>``, its output streamed to the task log;
    with ``sync``, then ``dvc push --run-cache`` of that stage (only a completed stage is pushed)."""
    logger = get_run_logger()
    target = f"{stage}@{slug}" if slug else stage  # `summary` has no slug
    args = ["repro", "--single-item", *(["--pull"] if sync else []), target]
    # without a remote, DVC's "Use `dvc push` ..." hint is noise in the task log
    drop = None if sync else (lambda line: line.startswith("Use `dvc push`"))
    out = run_streaming(dvc(*args), Path(root), logger, timeout=timeout_s, what=f"dvc repro {target}", drop=drop)
    if sync:
        dvc_remote.push(Path(root), [target], logger)
    info = {}
    if slug:
        from stages.common.runner import runtime_file

        info_path = runtime_file(slug, stage, Path(root))
        info = json.loads(info_path.read_text()) if info_path.exists() else {}
    return {"stage": stage, "dvc": dvc_status(out, target), "runtime_s": info.get("runtime_s")}


@task(name="stage", task_run_name="{stage}@{slug} ({profile})", cache_policy=NO_CACHE, persist_result=False)
def run_stage_task(stage: str, slug: str, root: str, profile: str, out_root: str,
                   timeout_s: float = STAGE_TIMEOUT_S) -> dict[str, Any]:
    """A non-default profile: ``python -m stages <stage> <slug> --profile <p> --root <out_root>``, so its
    outputs land in ``runs/<profile>/`` and never replace the committed default-profile results (DVC's
    lock file and reports/ describe the default profile only)."""
    logger = get_run_logger()
    cmd = [sys.executable, "-m", "stages", stage, slug, "--profile", profile, "--root", out_root]
    run_streaming(cmd, Path(root), logger, timeout=timeout_s, what=f"{stage}@{slug} --profile {profile}")
    from stages.common.runner import runtime_file

    info_path = runtime_file(slug, stage, Path(out_root))
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    return {"stage": stage, "dvc": f"ran ({profile}, no DVC)", "runtime_s": info.get("runtime_s")}


def embed_figures(markdown: str, report_dir: Path) -> str:
    """report.md with its relative ``figures/*.png`` links inlined as data URIs, so the figures
    render inside the Prefect UI's markdown artifact (which has no access to the checkout)."""
    import base64
    import re as _re

    def inline(match: "_re.Match[str]") -> str:
        path = report_dir / match.group(2)
        if not path.is_file():
            return match.group(0)
        data = base64.b64encode(path.read_bytes()).decode()
        return f"![{match.group(1)}](data:image/png;base64,{data})"

    return _re.sub(r"!\[(.*?)\]\((figures/[^)\s]+\.png)\)", inline, markdown)  # captions may hold "]"


def compact_verdicts(markdown: str) -> str:
    """The report's wide verdict table as a list that wraps in the Prefect UI (a 5-column table
    is cut off at the artifact pane's width)."""
    lines = markdown.splitlines()
    out, i = [], 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("| claim | verdict |"):  # (finding and check tables alike)
            i += 2  # header and rule
            while i < len(lines) and lines[i].startswith("| "):
                cells = [c.strip() for c in lines[i].strip().strip("|").split(" | ")]
                if len(cells) >= 6:  # claim | verdict | statement | measured | thresholds | refuted
                    name, verdict, statement, measured, thresholds, refuted = cells[:6]
                    measured += f"  \n  *thresholds (params):* {thresholds}" if thresholds not in ("", "—") else ""
                elif len(cells) >= 5:
                    name, verdict, statement, measured, refuted = cells[:5]
                if len(cells) >= 5:
                    out.append(f"- **{name}** — {verdict}: {statement}  \n  *measured:* {measured}"
                               + (f"  \n  *would have refuted it:* {refuted}" if refuted not in ("", "—") else ""))
                i += 1
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


def claims_rows(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """One short row per claim: verdict first, the numbers in words, no raw JSON."""
    rows = []
    for c in metrics.get("claims", []):
        verdict = verdict_of(c)
        measured = "; ".join(
            f"{k} = " + (", ".join(f"{x:.3g}" if isinstance(x, (int, float)) else str(x) for x in v)  # null: n/a
                         if isinstance(v, list) else f"{v:.4g}" if isinstance(v, float) else str(v))
            for k, v in c.get("values", {}).items())
        rows.append({"name": c["name"], "verdict": verdict, "measured": measured, "statement": c["statement"],
                     "kind": "claim", "runtime_s": None})
    return rows


@task(name="dvc-pull", cache_policy=NO_CACHE, persist_result=False)
def pull_task(slug: str, root: str) -> str:
    logger = get_run_logger()
    label = dvc_remote.check(Path(root))
    logger.info("DVC remote %s: pulling outputs and run-cache for %s", label, slug)
    dvc_remote.pull(Path(root), [f"{s}@{slug}" for s in STAGES], logger)
    return label


@task(name="publish-artifacts", task_run_name="publish-{slug}", cache_policy=NO_CACHE, persist_result=False)
def publish(slug: str, root: str, stages: list[dict[str, Any]], report_root: str | None = None) -> dict[str, Any]:
    """report.md -> markdown artifact; claims + runtimes -> table artifact; the claims again as a
    markdown list (wraps in the UI, findings first)."""
    report_dir = Path(report_root or root) / "reports" / slug
    md = embed_figures(compact_verdicts((report_dir / "report.md").read_text()), report_dir)
    create_markdown_artifact(md, key=artifact_key(slug, "report"), description=f"{slug}: report.md")
    metrics = json.loads((report_dir / "metrics.json").read_text())
    rows = claims_rows(metrics)
    rows += [{"name": f"stage {s['stage']}", "verdict": f"dvc: {s['dvc']}",
              "measured": "" if s["runtime_s"] is None else f"runtime {s['runtime_s']:.1f} s", "statement": "",
              "kind": "stage", "runtime_s": s["runtime_s"]} for s in stages]
    create_table_artifact(rows, key=artifact_key(slug, "claims"),
                          description=f"{slug}: claims (verdict and numbers) and what DVC did with each stage")
    from stages.common.claims import findings_line

    listing = [f"# {slug}: {findings_line(metrics.get('claims', []))}", ""]
    for kind in ("finding", "check"):
        group = [c for c in metrics.get("claims", []) if c.get("kind", "finding") == kind]
        if group:
            listing.append(f"## {kind}s")
            listing += [f"- **{c['name']}** — {verdict_of(c)}: {c['statement']}" for c in group]
            listing.append("")
    create_markdown_artifact("\n".join(listing), key=artifact_key(slug, "verdicts"),
                             description=f"{slug}: findings and checks (wrapped)")
    return {"claims": {c["name"]: verdict_of(c)
                       for c in metrics.get("claims", [])}}


def _has_default_remote(root: Path) -> bool:
    """Whether DVC's merged config (project + local) of the checkout names a default remote."""
    from dvc.repo import Repo

    try:
        with Repo(str(root)) as repo:
            return bool(repo.config["core"].get("remote"))
    except Exception:
        return False


@flow(name="paper", flow_run_name="paper-{slug}-{profile}", log_prints=True)
def paper_flow(slug: str, profile: str = "default", remote: str | None = None, sync: bool | None = None,
               root: str | None = None, stage_timeout_s: float = STAGE_TIMEOUT_S) -> dict[str, Any]:
    """Run one paper's four stages through DVC; publish its report and claims.

    profile: ``default`` runs ``dvc repro`` (cached, committed results); ``smoke`` / ``full`` run the stages
             with that profile into ``runs/<profile>/`` of the checkout (no DVC: the lock file and reports/
             describe the default profile), and publish that run's report.
    remote: a folder or URL made the default DVC remote of this checkout (``.dvc/config.local``).
    sync:   pull before / push after (default: whenever the checkout has a default remote).
    root:   the checkout (default: the one this module is imported from).
    """
    from stages.common.config import read_params

    logger = get_run_logger()
    checkout = Path(root).resolve() if root else ROOT
    papers = read_params(checkout / "params.yaml")["papers"]
    if slug not in papers:
        raise ValueError(f"papers.{slug}: unknown paper (registered: {', '.join(sorted(papers)) or 'none'})")
    from stages.common.config import PROFILES

    if profile not in PROFILES:
        raise ValueError(f"profile: must be one of {', '.join(PROFILES)} (got {profile!r})")
    if profile != "default":
        out_root = checkout / "runs" / profile
        results, upstream = [], []
        for stage in STAGES:
            state = run_stage_task(stage, slug, str(checkout), profile, str(out_root), timeout_s=stage_timeout_s,
                                   wait_for=upstream, return_state=True)
            results.append(state.result())
            upstream = [state]
        published = publish(slug, str(checkout), results, report_root=str(out_root), wait_for=upstream)
        from stages.common.summary import claims_line

        logger.info(claims_line(slug, out_root))
        return {"slug": slug, "profile": profile, "stages": {r["stage"]: r["dvc"] for r in results}, **published}
    if remote:
        dvc_remote.configure(remote, checkout, name="flow", local=True)
    if sync is None:
        sync = _has_default_remote(checkout)
    logger.info("paper %s in %s (DVC remote sync: %s)", slug, checkout, sync)
    if sync:
        pull_task(slug, str(checkout))
    results, upstream = [], []
    for stage in STAGES:  # each stage waits for the previous one: the run graph shows the chain
        state = repro_stage(stage, slug, str(checkout), sync=sync, timeout_s=stage_timeout_s,
                            wait_for=upstream, return_state=True)
        results.append(state.result())
        upstream = [state]
    for r in results:
        logger.info("%s@%s: dvc %s (runtime_s %s)", r["stage"], slug, r["dvc"], r["runtime_s"])
    published = publish(slug, str(checkout), results, wait_for=upstream)
    from stages.common.summary import claims_line

    logger.info(claims_line(slug, checkout))
    return {"slug": slug, "profile": profile, "stages": {r["stage"]: r["dvc"] for r in results}, **published}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.paper_flow", description=__doc__.splitlines()[0])
    parser.add_argument("slug")
    parser.add_argument("--profile", default="default", help="smoke | default | full (non-default: runs/<profile>/)")
    parser.add_argument("--remote", default=None, help="DVC remote folder/URL to pull from and push to")
    parser.add_argument("--no-sync", action="store_true", help="do not pull/push even if a remote is configured")
    args = parser.parse_args(argv)
    from stages.common.config import ConfigError

    try:
        check_configured_api()
        state = paper_flow(args.slug, profile=args.profile, remote=args.remote,
                           sync=False if args.no_sync else None, return_state=True)
    except (ConfigError, dvc_remote.RemoteError, ServeError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not state.is_completed():
        print(f"error: paper flow {args.slug}: {state.name}: {state.message}", file=sys.stderr)
        return 1
    print(json.dumps(state.result(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
