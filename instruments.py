"""Does a trained aggregator need its candidates? The probe evaluate.py --probe-aggregators runs on each policy.

Line 13 can only act while the set scores f_hat(x, G) depend on G: an aggregator that re-solves the problem from its
prompt scores every set alike, and set RL then has nothing to estimate (spiral.py logs the training-time side of
this as line13/*). This probe measures it after training. For each problem, candidate sets of n = --rsa-set-size
traces are built from the search traces every evaluated policy wrote for it (right and wrong ones, graded), and each
policy's aggregator writes `samples` aggregation traces over each set:

    all right     n right traces (distinct texts while there are enough)        an aggregator that reads: ~1
    one right     1 right trace and n - 1 wrong ones (distinct)                 selecting or verifying
    none right    n wrong traces, distinct answers first                        recovery: re-solving
    wrong copies  n copies of one wrong trace                                   an aggregator that reads: ~0

so `all right - wrong copies` is the aggregator's dependence on its candidates (1: it follows them; 0: it ignores
them) and `none right` its recovery. A kind is skipped for a problem whose pool lacks the traces it needs; each
result says over how many problems it was measured. `copied` is the fraction of aggregation traces over `wrong
copies` that give the copied wrong answer (math task only: a user's reward has no answers to compare).
"""

from __future__ import annotations

import numpy as np

import rollout
from tracecache import Trace

PROBE_KINDS = ("all right", "one right", "none right", "wrong copies")


def _first_of_each(indices: list[int], key) -> list[int]:
    """The first index of each distinct key(index), in order."""
    seen = {}
    for i in indices:
        seen.setdefault(key(i), i)
    return list(seen.values())


def probe_sets(graded: list[dict], texts: list[str], set_size: int) -> dict[str, list[int]]:
    """{kind: indices into `texts`} for one problem's pooled search traces (graded: {"correct", "answer"} each, in
    the order of `texts`); a kind whose traces the pool lacks is left out."""
    right = _first_of_each([i for i, g in enumerate(graded) if g["correct"]], lambda i: texts[i])
    wrong = _first_of_each([i for i, g in enumerate(graded) if not g["correct"]], lambda i: texts[i])
    one_per_answer = _first_of_each(wrong, lambda i: graded[i]["answer"])
    wrong_spread = one_per_answer + [i for i in wrong if i not in one_per_answer]  # distinct answers first
    sets = {}
    if right:
        sets["all right"] = [right[j % len(right)] for j in range(set_size)]
    if right and len(wrong_spread) >= set_size - 1:
        sets["one right"] = [right[0], *wrong_spread[:set_size - 1]]
    if len(wrong_spread) >= set_size:
        sets["none right"] = wrong_spread[:set_size]
    if wrong:
        sets["wrong copies"] = [wrong[0]] * set_size
    return sets


def probe_aggregators(problems, pools: dict[str, list[list]], samplers: dict, grade, set_size: int,
                      max_new_tokens: int, samples: int = 4) -> dict[str, dict]:
    """The probe for every policy's aggregator over the candidate sets built from all policies' pools.

    pools: {label: per problem, that policy's search traces (tracecache.Trace)}; grade(traces, problem) -> graded
    dicts (evaluate._graded); samplers: {label: tracecache.Sampler}. Returns {label: {kind: {"problems",
    "accuracy"}, with "copied" for "wrong copies"}}.
    """
    sets_P, texts_P = [], []
    for i, problem in enumerate(problems):
        traces = [t for label in pools for t in pools[label][i]]  # every policy's, in command order
        texts_P.append([t.text for t in traces])
        sets_P.append(probe_sets(grade(traces, problem), texts_P[i], set_size))
    out = {}
    for label, sampler in samplers.items():
        out[label] = {}
        for kind in PROBE_KINDS:
            chosen = [i for i, sets in enumerate(sets_P) if kind in sets]
            prompts_P = [[rollout.aggregation_prompt(problems[i].problem, [texts_P[i][j] for j in sets_P[i][kind]])]
                         * samples for i in chosen]
            traces_P = sampler.aggregate(0, prompts_P, max_new_tokens, stage=f"probe-{kind}") if chosen else []
            right, copied = [], []
            for i, traces in zip(chosen, traces_P):
                graded = grade(traces, problems[i])
                right += [g["correct"] for g in graded]
                if kind == "wrong copies":
                    wrong_answer = grade([Trace(texts_P[i][sets_P[i][kind][0]], 0, 0, False)], problems[i])[0]
                    if wrong_answer["answer"] is not None:  # the math task; a user's reward has no answers
                        copied += [g["answer"] == wrong_answer["answer"] for g in graded]
            out[label][kind] = {"problems": len(chosen), "accuracy": float(np.mean(right)) if right else None}
            if kind == "wrong copies":
                out[label][kind]["copied"] = float(np.mean(copied)) if copied else None
    return out


def dependence(probe: dict) -> float | None:
    """accuracy on all-right sets minus accuracy on n copies of one wrong trace: 1 follows the candidates, 0
    ignores them."""
    a, b = probe.get("all right", {}).get("accuracy"), probe.get("wrong copies", {}).get("accuracy")
    return None if a is None or b is None else a - b


if __name__ == "__main__":  # a library: --help prints what it holds; nothing runs
    import cli

    cli.library_main(__doc__, "instruments.py", "evaluate.py uses")
