"""instruments.py: the candidate sets the aggregator probe builds, and what it says of an aggregator that follows
its candidates against one that re-solves the problem; evaluate.py --probe-aggregators end to end on the tiny
policy."""

import json
import re

import pytest

import evaluate
import instruments
import tiny
from problemset import Problem
from tracecache import Trace


def graded_of(answers, gold):
    return [{"correct": a == gold, "answer": a} for a in answers]


def test_probe_sets_by_hand():
    """Right and wrong traces by text, wrong answers spread before repeats, copies of the first wrong trace."""
    answers = ["7", "3", "7", "5", "3", "9", "7"]  # gold 7; texts below: trace 2 repeats trace 0's text
    texts = ["a=7", "b=3", "a=7", "c=5", "d=3", "e=9", "f=7"]
    sets = instruments.probe_sets(graded_of(answers, "7"), texts, 4)
    assert sets["all right"] == [0, 6, 0, 6]  # two distinct right texts, cycled
    assert sets["one right"] == [0, 1, 3, 5]  # wrong answers 3, 5, 9: one trace each
    assert sets["none right"] == [1, 3, 5, 4]  # then the second trace answering 3
    assert sets["wrong copies"] == [1, 1, 1, 1]
    only_wrong = instruments.probe_sets(graded_of(["1", "2"], "7"), ["x1", "x2"], 4)
    assert set(only_wrong) == {"wrong copies"}  # too few wrong traces for "none right", none right at all
    assert set(instruments.probe_sets(graded_of(["7"], "7"), ["r"], 4)) == {"all right"}


class StandIn:
    """A sampler whose aggregation traces follow a rule over the candidates in the prompt; records its calls."""

    def __init__(self, rule):
        self.rule, self.calls = rule, []

    def aggregate(self, step, prompts_run, max_new_tokens, stage=None):
        self.calls.append(stage)
        return [[Trace(self.rule(p), 1, 1, False) for p in prompts] for prompts in prompts_run]


def candidates(prompt):
    return re.findall(r"answer=(\d+)", prompt)


def test_an_aggregator_that_follows_its_candidates_against_one_that_re_solves():
    problems = [Problem("What is 3 + 4?", "7", "p0"), Problem("What is 1 + 1?", "2", "p1")]
    pools = {"a": [[Trace(f"answer={x}", 1, 1, False) for x in ("7", "3", "5", "6", "9")],
                   [Trace(f"answer={x}", 1, 1, False) for x in ("4", "4", "5", "8")]]}

    def grade(traces, problem):
        return graded_of([candidates(t.text)[0] if candidates(t.text) else None for t in traces], problem.answer)

    follower = StandIn(lambda p: f"answer={candidates(p)[0]}")  # copies its first candidate
    solver = StandIn(lambda p: "answer=" + str(sum(map(int, re.findall(r"What is (\d+) \+ (\d+)", p)[0]))))
    out = instruments.probe_aggregators(problems, pools, {"follows": follower, "solves": solver}, grade, 4, 8)
    f, s = out["follows"], out["solves"]
    assert f["all right"] == {"problems": 1, "accuracy": 1.0}  # p1's pool has no right trace
    assert f["wrong copies"] == {"problems": 2, "accuracy": 0.0, "copied": 1.0}
    assert f["one right"]["accuracy"] == 1.0 and f["none right"] == {"problems": 1, "accuracy": 0.0}
    assert instruments.dependence(f) == 1.0
    assert s["wrong copies"] == {"problems": 2, "accuracy": 1.0, "copied": 0.0}
    assert s["none right"]["accuracy"] == 1.0 and instruments.dependence(s) == 0.0
    assert follower.calls == [f"probe-{kind}" for kind in instruments.PROBE_KINDS]


def test_copied_is_none_for_a_task_without_answers():
    problems = [Problem("x", "y", "p0")]
    pools = {"a": [[Trace("w1", 1, 1, False), Trace("w2", 1, 1, False)]]}
    grade = lambda traces, problem: [{"correct": False, "answer": None} for _ in traces]  # noqa: E731
    out = instruments.probe_aggregators(problems, pools, {"a": StandIn(lambda p: "w1")}, grade, 2, 8)
    assert out["a"]["wrong copies"] == {"problems": 1, "accuracy": 0.0, "copied": None}
    assert out["a"]["all right"] == {"problems": 0, "accuracy": None}


def test_evaluate_probe_aggregators_end_to_end(tmp_path, capsys):
    """The flag adds summary["probe"] to every policy, built from the pools evaluate.py already sampled (read back
    from the cache), and a second run generates nothing."""
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"problem": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n"
                            for a, b in ((1, 2), (3, 4), (5, 1))))
    args = ["--preset", "tiny", "--data", str(data), "--method", "passk", "--num-samples", "4", "--probe-aggregators",
            "--policy", f"base={tiny.WARM_START_DIR}", "--out", str(tmp_path / "r.json")]
    assert evaluate.main(args) == 0
    probe = json.loads((tmp_path / "r.json").read_text())["policies"]["base"]["summary"]["probe"]
    assert set(probe) == set(instruments.PROBE_KINDS)
    assert sum(probe[k]["problems"] for k in probe) > 0 and probe["wrong copies"]["problems"] <= 3
    capsys.readouterr()
    assert evaluate.main(args) == 0
    assert "traces generated: 0," in capsys.readouterr().out
    assert json.loads((tmp_path / "r.json").read_text())["policies"]["base"]["summary"]["probe"] == probe


def test_a_bad_set_size_is_refused_before_the_probe(tmp_path, capsys):
    code = evaluate.main(["--preset", "tiny", "--probe-aggregators", "--rsa-set-size", "0",
                          "--out", str(tmp_path / "r.json")])
    assert code == 2 and "rsa-set-size" in capsys.readouterr().err
