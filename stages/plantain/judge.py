"""A learned plan judge that can be wrong (issue 47): a small MLP classifier (scikit-learn) that reads the problem
statement and a candidate plan and says whether the plan is the right one. It is trained on labelled (problem,
plan) pairs of the judge split (prepare: problems disjoint from the test problems, half of them with one injected
plan error) and never compares with the gold plan when it judges. Its accuracy, precision and recall on held-out
pairs are measured; judges trained on fewer pairs are less accurate, which gives Rewind-and-Repeat's gains as a
function of judge accuracy, with the rule-based oracle (``task.validate_plan``) as the upper bound.

    judge = PlanJudge.fit(problems, plans, labels, hidden=64, seed=0)
    judge(problem, plan) -> bool               # the signature task.reward and Rewind-and-Repeat take
    judge.accept(problems, plans) -> (N,) bool # batched
    quality(judge, problems, plans, labels)    # accuracy, precision, recall (positive = "plan is right")
"""
from __future__ import annotations

import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPClassifier

from stages.plantain.task import MAX_OPS, PROMPT_LEN, VOCAB_SIZE, Problem

PLAN_SLOTS = 2 * MAX_OPS               # (operation, operand) tokens of up to MAX_OPS plan items


def features(problems: list[Problem], plans: list[list[tuple[int, int]] | None]) -> np.ndarray:
    """One-hot of the (left-padded) prompt tokens and of the plan's operation/operand tokens in execution order
    (a missing or unparseable plan: an all-zero plan block)."""
    X = np.zeros((len(problems), (PROMPT_LEN + PLAN_SLOTS) * VOCAB_SIZE), dtype=np.float32)
    for i, (p, plan) in enumerate(zip(problems, plans)):
        for j, t in enumerate(p.prompt()):
            X[i, j * VOCAB_SIZE + t] = 1.0
        for j, t in enumerate([t for o, d in (plan or [])[:MAX_OPS] for t in (o, d)]):
            X[i, (PROMPT_LEN + j) * VOCAB_SIZE + t] = 1.0
    return X


class PlanJudge:
    """ALGO (issue 47): a learned binary plan judge, P(plan right | problem, plan) > 0.5."""

    def __init__(self, clf: MLPClassifier, n_train: int):
        self.clf, self.n_train = clf, n_train

    @classmethod
    def fit(cls, problems: list[Problem], plans: list, labels, hidden: int = 64, seed: int = 0,
            max_iter: int = 300) -> "PlanJudge":
        y = np.asarray(labels, dtype=int)
        if len(problems) != len(plans) or len(plans) != len(y):
            raise ValueError(f"judge data: {len(problems)} problems, {len(plans)} plans, {len(y)} labels")
        if len(set(y.tolist())) < 2:
            raise ValueError("judge data: the labels hold one class only (need right and wrong plans)")
        clf = MLPClassifier(hidden_layer_sizes=(hidden,), max_iter=max_iter, random_state=seed,
                            early_stopping=False)
        with warnings.catch_warnings():       # a capped max_iter is a budget, not an error
            warnings.simplefilter("ignore", ConvergenceWarning)
            clf.fit(features(problems, plans), y)
        return cls(clf, len(y))

    def accept(self, problems: list[Problem], plans: list) -> np.ndarray:
        ok = np.array([p is not None for p in plans])
        out = np.zeros(len(plans), dtype=bool)
        if ok.any():
            idx = np.flatnonzero(ok)
            out[idx] = self.clf.predict(features([problems[i] for i in idx], [plans[i] for i in idx])) == 1
        return out                                   # an unparseable plan is never accepted

    def __call__(self, problem: Problem, plan) -> bool:
        return bool(self.accept([problem], [plan])[0])


def quality(judge, problems: list[Problem], plans: list, labels) -> dict[str, float]:
    """Accuracy, precision and recall of ``judge`` (anything with ``accept`` or a per-pair callable) on labelled
    pairs; positive = the plan is right."""
    y = np.asarray(labels, dtype=bool)
    pred = (judge.accept(problems, plans) if hasattr(judge, "accept")
            else np.array([bool(judge(p, q)) for p, q in zip(problems, plans)]))
    tp = float((pred & y).sum())
    return {"accuracy": float((pred == y).mean()), "precision": tp / max(1.0, float(pred.sum())),
            "recall": tp / max(1.0, float(y.sum())), "n": int(len(y))}
