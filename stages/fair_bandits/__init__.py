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
    python -m stages.fair_bandits.simulate --scm SCM.json --horizon T --seeds S --out R.json

Modules: scm (the SCM format, exact effects), methods (DO-LogB, tabular, primal-dual, UCB,
oracle), simulate (batched engine + CLI), metrics (regret, violations, slopes);
kernel: kernels/fair_round_step.py.
"""
