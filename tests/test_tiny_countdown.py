"""The third CPU task (tiny_countdown.py): the generator, the checker that is its reward, the solver and the
selecting aggregator the warm start imitates, the shipped problem files and the presets that name them."""

import itertools
import os
import sys

import numpy as np

import evaluate
import problemset
import task
import tiny_countdown as cd
import train

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))


def test_problems_are_deterministic_distinct_solvable_and_the_splits_disjoint():
    problems = cd.countdown_problems()
    assert problems == cd.countdown_problems() and len({p.problem for p in problems}) == 1000
    heldout = cd.heldout_problems()
    assert len(heldout) == 200 and not {p.problem for p in heldout} & {p.problem for p in problems}
    assert cd.countdown_problems(5, seed=7) != cd.countdown_problems(5, seed=8)
    for p in problems[:50]:
        target, numbers = cd.problem_numbers(p.problem)
        assert len(numbers) == cd.NUMBERS and all(1 <= x <= cd.LARGEST for x in numbers) and p.answer == str(target)
        assert 0 < cd.solver_hit_rate(p) < 1  # every problem has a solution (its target is a chain's value)


def test_chain_values_against_python_arithmetic():
    for numbers in [(3, 7, 2, 9, 4), (9, 9, 9, 9, 9), (1, 5, 8, 2, 6)]:
        for ops in cd.all_ops(numbers):
            expression = str(numbers[0])
            for op, x in zip(ops, numbers[1:]):
                expression = f"({expression}){op}{x}"
            assert cd.chain_values(numbers, ops)[-1] == eval(expression) % 10
    assert len(cd.all_ops((1, 2, 3, 4, 5))) == 81 == len(set(cd.all_ops((1, 2, 3, 4, 5))))


def test_trace_format_and_the_checker_on_right_and_wrong_traces():
    assert cd.trace_text((3, 7, 2, 9, 4), "+-*-") == "3+7=0-2=8*9=2-4=8 \\boxed{8}"
    p = problemset.Problem("Reach 8 from 3 7 2 9 4 mod 10.", "8")
    assert cd.reward(p, "3+7=0-2=8*9=2-4=8 \\boxed{8}") == 1.0
    assert cd.reward(p, " 3+7=0-2=8*9=2-4=8  \\boxed{8} ") == 1.0  # surrounding spaces are not an error
    assert cd.reward(p, "3+7=0+2=2+9=1+4=5 \\boxed{5}") == 0.0  # a right chain that misses the target
    wrong = ["3+7=0-2=8*9=2-4=8 \\boxed{9}",  # boxed answer is not the last value
             "3+7=1-2=9*9=1*4=4 \\boxed{8}",  # wrong running values
             "3+7=0-2=8*9=3-4=9 \\boxed{9}",  # one wrong value, then right steps from it
             "3+7=0-2=8*9=2 \\boxed{2}",  # a number left out
             "7+3=0-2=8*9=2-4=8 \\boxed{8}",  # the numbers out of order
             "3+7=0-2=8*9=2-4=8-0=8 \\boxed{8}",  # a number not given
             "3+7=10-2=8*9=2-4=8 \\boxed{8}",  # a value not reduced mod 10
             "", "\\boxed{8}", "8", "3+7=0-2=8*9=2-4=8 \\boxed{8} 1"]  # empty, bare answers, text after
    assert [cd.reward(p, w) for w in wrong] == [0.0] * len(wrong)


def test_the_solver_tries_every_chain_uniformly_and_hits_at_its_hit_rate():
    rng = np.random.default_rng(0)
    p = cd.heldout_problems()[0]
    numbers = cd.problem_numbers(p.problem)[1]
    traces = [cd.solver_trace(p.problem, rng) for _ in range(8100)]
    counts = {t: traces.count(t) for t in set(traces)}
    assert set(counts) == {cd.trace_text(numbers, ops) for ops in cd.all_ops(numbers)}
    assert max(counts.values()) < 160 and min(counts.values()) > 50  # ~100 each
    hits = np.mean([cd.reward(p, t) for t in traces])
    rate = cd.solver_hit_rate(p)
    assert abs(hits - rate) < 4 * np.sqrt(rate * (1 - rate) / len(traces))


def test_the_warm_start_aggregator_selects_a_right_candidate_and_never_solves():
    rng = np.random.default_rng(0)
    p = problemset.Problem("Reach 8 from 3 7 2 9 4 mod 10.", "8")
    right, wrong, other = ("3+7=0-2=8*9=2-4=8 \\boxed{8}", "3+7=0+2=2+9=1+4=5 \\boxed{5}",
                           "3*7=1+2=3+9=2+4=6 \\boxed{6}")
    assert {cd.aggregator_target(p.problem, [wrong, right, other, wrong], rng) for _ in range(20)} == {right}
    assert {cd.aggregator_target(p.problem, [wrong, other], rng) for _ in range(50)} == {wrong, other}  # a copy
    tail = [cd.training_example(np.random.default_rng(1), 1.0, 4) for _ in range(2)]
    assert tail[0][0] and "Solution 4:" in tail[0][1] and tail[0][2].endswith("}")


def test_shipped_files_and_presets():
    assert problemset.load_problems(cd.PROBLEMS_FILE) == cd.countdown_problems()
    assert problemset.load_problems(cd.HELDOUT_FILE) == cd.heldout_problems()
    assert task.load_reward(cd.REWARD) is cd.reward
    cfg = train.resolve_config({"preset": "tiny_countdown"})
    assert (cfg.model, cfg.data, cfg.reward, cfg.max_new_tokens) == (cd.WARM_START_DIR, cd.PROBLEMS_FILE, cd.REWARD, 28)
    assert evaluate.PRESETS["tiny_countdown"]["data"] == cd.HELDOUT_FILE
    import set_rl

    assert set_rl.TASKS["tiny_countdown"].heldout_file == os.path.relpath(cd.HELDOUT_FILE, REPO)


def test_planned_detectable_matches_welch_on_seeds_with_that_sd():
    import set_rl_report
    import stats

    a, b = [0.0, 0.1, 0.2, 0.3, 0.4], [1.0, 1.1, 1.2, 1.3, 1.4]  # sd 0.158 each
    sd = float(np.std(a, ddof=1))
    assert abs(set_rl_report.planned_detectable(sd, 5) - stats.detectable(a, b)) < 1e-9
