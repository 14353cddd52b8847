"""Prefect orchestration of the paper pipelines.

- ``flows.paper_flow``: one paper's four stages as Prefect tasks (each ``dvc repro -s <stage>@<slug>``),
  report and claims published as artifacts; optional DVC remote pull/push (run-cache included).
- ``flows.all_papers``: every registered paper, then the ``summary`` stage.
- ``flows.serve``: deployments with cron schedules for the Prefect UI (``--with-server``).
- ``flows.pools``: work pool + per-worker queues + crash detection + ``from_source`` deployments.
- ``flows.remote``: the DVC remote (``make remote REMOTE=...``), checked before use.
- ``flows.wandb_report``: a W&B Report per paper.
"""
