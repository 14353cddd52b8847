"""fair_bandits — contextual bandits under counterfactual-fairness constraints (miniature reproduction).

Chen, Tian, Quinn, "A Causal Decomposition Approach for Fair Contextual Multi-Armed Bandits"
(ICML 2026; official code github.com/jchen-research/DO-LogB, logistic setting). Each round a
context (a, z, w) arrives from a standard fairness model (protected A, confounder Z, mediator W);
the learner picks an arm d, earns Y ~ Bernoulli(σ(θ*ᵀ f([a,z,w,d]))) and must keep the arm's
counterfactual direct, indirect and spurious effects |DE|, |IE|, |SE| below τ.

    python -m stages prepare fair_bandits    # validate SCMs, compile exact worlds, draw contexts
    python -m stages train fair_bandits      # run every learner over all seeds at once (kernel)
    python -m stages evaluate fair_bandits   # regret / violation / penalized regret, slopes, timing
    python -m stages report fair_bandits     # report.md, figures, claims
    python -m stages.fair_bandits.simulate --scm SCM.json --horizon T --seeds S --out R.json [--threads 1]

Modules: scm (the SCM format, exact effects; effect_cells "official_quirk" = the official code's
one-cell computation; tau_mode "boundary" = no Slater point), methods (DO-LogB, tabular, primal-dual,
UCB, oracle), simulate (batched multi-world engine + CLI), metrics (regret, violations, exponents),
official_ref (a transcription of the official loop: reproduction check and timing);
kernel: kernels/fair_round_step.py.
"""

from stages.common.sources import Source

SOURCES = [Source(
    real=None,
    note=("the official DO-LogB environment (jchen-research/DO-LogB, "
          "bandits/bandit.py + synthetic_data.py) as SCM files (official.json, official_quirk.json) and this "
          "project's binding/boundary worlds; the paper's experiments are synthetic too (no dataset to load). "
          "Any SCM in the documented format (stages/fair_bandits/scm.py) can be passed to prepare or the CLI."),
)]
