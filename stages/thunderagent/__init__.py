"""thunderagent — program-aware agentic inference (miniature reproduction of ThunderAgent).

LLM Programs P = ⟨id, context c, tool environments, backend, phase Reasoning/Acting, status⟩ are
scheduled as units: every Δt the scheduler checks thrashing (Σ_R c + w·Σ_A c·f(t) + 100·n > C),
pauses shortest programs first (Acting before Reasoning), restores Reasoning > New > Acting smallest
first with Best-Fit-Decreasing placement across backends from one global queue, prepares tool
environments asynchronously and cleans them with hooks. Compared against vLLM-like (request FCFS +
LRU) and Continuum-like (TTL pinning) baselines in a discrete-event simulator, and a tiny real engine
(the shared tiny GPT with a paged KV cache) that replays the scheduler's decisions.

    python -m stages prepare thunderagent    # workloads (JSONL, workload.py format) per seed/concurrency
    python -m stages train thunderagent      # real paged engine replays traces; fit cost model a, b, p, q
    python -m stages evaluate thunderagent   # policy sweep, victim-order ablation, starvation (#46) study
    python -m stages report thunderagent     # report.md, figures, claims
    python -m stages.thunderagent.simulate --workload W.jsonl --policy thunderagent --out R.json

Modules: workload (format + generator), sim (simulator + schedulers), engine (real paged engine),
simulate (CLI); kernel: kernels/paged_decode_attention.py.
"""
