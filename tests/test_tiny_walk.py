"""The third CPU task (tiny_walk.py): the generator, the checker that is its reward, the solver and the selecting
aggregator the warm start imitates, the shipped problem files and the presets that name them."""

import os
import sys

import numpy as np

import evaluate
import problemset
import task
import tiny_walk as tw
import train

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
PROBLEM = problemset.Problem("Walk from 2 to 8 in 3 steps: 0>371 1>482 2>586 3>401 4>035 5>178 6>239 7>019 8>123 "
                             "9>045", "8")


def test_problems_are_deterministic_distinct_solvable_and_the_splits_disjoint():
    problems = tw.walk_problems()
    assert problems == tw.walk_problems() and len({p.problem for p in problems}) == 1000
    heldout = tw.heldout_problems()
    assert len(heldout) == 200 and not {p.problem for p in heldout} & {p.problem for p in problems}
    assert tw.walk_problems(5, seed=7) != tw.walk_problems(5, seed=8)
    for p in problems[:50]:
        start, target, graph = tw.parse_problem(p.problem)
        assert p.answer == str(target) and len(graph) == tw.NODES
        assert all(len(set(s)) == tw.DEGREE and u not in s for u, s in enumerate(graph))  # distinct, no self-loop
        assert 0 < tw.solver_hit_rate(p) <= 1  # every problem has a solution (its target ends a walk)


def test_walks_is_the_brute_force_search_space():
    start, _, graph = tw.parse_problem(PROBLEM.problem)
    brute = [(a, b, c) for a in graph[start] for b in graph[a] for c in graph[b]]
    assert tw.walks(graph, start) == brute and len(brute) == 27
    assert tw.solver_hit_rate(PROBLEM) == sum(w[-1] == 8 for w in brute) / 27


def test_trace_format_and_the_checker_on_right_and_wrong_traces():
    assert tw.trace_text(2, (5, 1, 8)) == "2>5>1>8 \\boxed{8}"
    assert tw.reward(PROBLEM, "2>5>1>8 \\boxed{8}") == 1.0  # 2>5, 5>1, 1>8 are edges
    assert tw.reward(PROBLEM, " 2>6>3>4 \\boxed{4} ") == 0.0  # a walk that misses the target
    wrong = ["2>5>1>8 \\boxed{9}",  # boxed answer is not the last node
             "2>5>7>8 \\boxed{8}",  # 7>8 is not an edge (see below)
             "2>4>0>8 \\boxed{8}", "2>5>1>2>8 \\boxed{8}",  # 2>4 is not an edge; one step too many
             "3>5>1>8 \\boxed{8}", "2>5>8 \\boxed{8}",  # the wrong start; too few steps
             "", "\\boxed{8}", "8", "2>5>1>8 \\boxed{8} 1"]  # empty, bare answers, text after the answer
    graph = tw.parse_problem(PROBLEM.problem)[2]
    assert 7 in graph[5] and 8 not in graph[7]  # so "2>5>7>8" fails at its last step
    assert [tw.reward(PROBLEM, w) for w in wrong] == [0.0] * len(wrong)


def test_the_solver_walks_uniformly_and_hits_at_its_hit_rate():
    rng = np.random.default_rng(0)
    p = tw.heldout_problems()[0]
    start, _, graph = tw.parse_problem(p.problem)
    traces = [tw.solver_trace(p.problem, rng) for _ in range(5400)]
    expected = {tw.trace_text(start, w) for w in tw.walks(graph, start)}
    counts = {t: traces.count(t) for t in set(traces)}
    assert set(counts) <= expected and sum(counts.values()) == 5400
    assert max(counts.values()) < 4 * 5400 * len(set(counts)) ** -1  # no walk taken far more than its share
    hits = np.mean([tw.reward(p, t) for t in traces])
    rate = tw.solver_hit_rate(p)
    assert abs(hits - rate) < 4 * np.sqrt(rate * (1 - rate) / len(traces)) + 1e-9


def test_the_warm_start_aggregator_selects_a_right_candidate_and_never_solves():
    rng = np.random.default_rng(0)
    right, wrong, other = "2>5>1>8 \\boxed{8}", "2>6>3>4 \\boxed{4}", "2>8>1>9 \\boxed{9}"
    assert {tw.aggregator_target(PROBLEM.problem, [wrong, right, other, wrong], rng) for _ in range(20)} == {right}
    assert {tw.aggregator_target(PROBLEM.problem, [wrong, other], rng) for _ in range(50)} == {wrong, other}
    aggregation, prompt, target = tw.training_example(np.random.default_rng(1), 1.0, 4)
    assert aggregation and "Solution 4:" in prompt and target in prompt  # the target is one of the candidates


def test_shipped_files_and_presets():
    assert problemset.load_problems(tw.PROBLEMS_FILE) == tw.walk_problems()
    assert problemset.load_problems(tw.HELDOUT_FILE) == tw.heldout_problems()
    assert task.load_reward(tw.REWARD) is tw.reward
    cfg = train.resolve_config({"preset": "tiny_walk"})
    assert (cfg.model, cfg.data, cfg.reward, cfg.max_new_tokens) == (tw.WARM_START_DIR, tw.PROBLEMS_FILE, tw.REWARD, 16)
    assert evaluate.PRESETS["tiny_walk"]["data"] == tw.HELDOUT_FILE
    import set_rl

    assert set_rl.TASKS["tiny_walk"].heldout_file == os.path.relpath(tw.HELDOUT_FILE, REPO)


def test_planned_detectable_matches_welch_on_seeds_with_that_sd():
    import set_rl_report
    import stats

    a, b = [0.0, 0.1, 0.2, 0.3, 0.4], [1.0, 1.1, 1.2, 1.3, 1.4]  # sd 0.158 each
    sd = float(np.std(a, ddof=1))
    assert abs(set_rl_report.planned_detectable(sd, 5) - stats.detectable(a, b)) < 1e-9


def test_main_refuses_a_directory_that_is_not_a_walk_warm_start_before_writing_anything(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    before = open(tw.PROBLEMS_FILE, encoding="utf-8").read()
    assert tw.main(["--out", str(tmp_path), "--steps", "1"]) == 2
    assert "not a warm start" in capsys.readouterr().err and (tmp_path / "notes.txt").read_text() == "mine"
    assert open(tw.PROBLEMS_FILE, encoding="utf-8").read() == before


def test_an_unwritable_out_is_one_line_before_any_work(capsys):
    assert tw.main(["--out", "/proc/x/warm"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tiny_walk.py: error: ") and "/proc" in err
