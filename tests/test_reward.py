"""rollout.py, rewards: last-\\boxed{} extraction, math-verify grading (gold first), and the guarantees that
reward() never raises and never hangs, from any thread."""

import threading
import time

import pytest

import reward

# Generous bound for one call that has to wait out math-verify's own timeouts or the hard timeout, plus a worker
# restart, on a busy machine.
SLOW_CALL_BOUND_S = reward.GRADE_TIMEOUT_S + 10


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so the answer is \\boxed{5}.", "5"),
        ("\\boxed{3} at first, but then \\boxed{5}", "5"),  # the last one
        ("\\boxed{\\frac{1}{\\sqrt{4}}}", "\\frac{1}{\\sqrt{4}}"),  # nested braces
        ("\\boxed {x + 1}", "x + 1"),  # space before the brace
        ("\\fbox{7}", "7"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces do not nest
        ("\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
        ("\\boxed{5} and then a truncated \\boxed{\\frac{1}{", None),  # the last one is never closed
        ("no box here: 5", None),
        ("\\boxed{}", None),
        ("\\boxed{   }", None),
        ("", None),
        (None, None),
        ("\\boxed", None),
        ("}}}{{{\\boxed{{{", None),
    ],
)
def test_extract_answer(text, expected):
    assert reward.extract_answer(text) == expected


def test_extract_answer_is_fast_on_long_and_adversarial_text():
    start = time.perf_counter()
    assert reward.extract_answer("x" * 200_000 + "\\boxed{42}") == "42"
    assert reward.extract_answer("\\boxed{" * 30_000) is None
    assert reward.extract_answer("\\boxed{" + "{" * 100_000 + "}" * 100_000 + "}") == "{" * 100_000 + "}" * 100_000
    assert time.perf_counter() - start < 2.0


@pytest.mark.parametrize(
    "completion, gold",
    [
        ("\\boxed{204}", "204"),
        ("Thus \\boxed{204.0}", "204"),
        ("\\boxed{0.5}", "\\frac{1}{2}"),
        ("\\boxed{\\dfrac12}", "\\frac{1}{2}"),
        ("\\boxed{1/2}", "0.5"),
        ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{\\sqrt2}{2}"),
        ("\\boxed{(x+1)^2}", "x^2+2x+1"),
        ("\\boxed{(3,\\pi/2)}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("\\boxed{[-2, 7)}", "[-2,7)"),
        ("\\boxed{(-\\infty,3]}", "(-\\infty, 3]"),
        ("\\boxed{x = 5}", "5"),
        ("\\boxed{\\text{(C)}}", "\\text{(C)}"),
    ],
)
def test_right_answers_score_one(completion, gold):
    assert reward.reward(completion, gold) == 1.0


@pytest.mark.parametrize(
    "completion, gold",
    [
        ("\\boxed{205}", "204"),
        ("\\boxed{0.51}", "\\frac{1}{2}"),
        ("\\boxed{(x-1)^2}", "x^2+2x+1"),
        ("\\boxed{(\\pi/2, 3)}", "\\left( 3, \\frac{\\pi}{2} \\right)"),  # tuples are ordered
        ("\\boxed{[-2, 7]}", "[-2,7)"),  # closed vs half-open interval
        ("\\boxed{204} no wait, \\boxed{205}", "204"),  # only the last \boxed counts
        ("The answer is 204.", "204"),  # no \boxed
        ("\\boxed{204", "204"),  # unbalanced
    ],
)
def test_wrong_answers_score_zero(completion, gold):
    assert reward.reward(completion, gold) == 0.0


@pytest.mark.parametrize(
    "completion",
    [
        "",
        None,
        12345,
        "x" * 200_000,
        "\\boxed{" + "1" * 200_000 + "}",  # longer than MAX_ANSWER_CHARS: not parsed
        "\\boxed{{{5}",
        "\\boxed{5}}}}",  # extra closing braces after a complete box: still the answer 5, wrong here
        "\x00\x01\x02\x1b[31m\\boxed{\x07\x00}",
        "\\boxed{\ud800}",  # a lone surrogate
        "\\boxed{\\frac{1}{0}}",
        "\\boxed{$$$}",
        "\\boxed{\\left(}",
    ],
)
def test_junk_scores_zero_without_raising(completion):
    assert reward.reward(completion, "6") == 0.0


def test_long_completion_with_a_final_box_is_graded():
    assert reward.reward("blah " * 40_000 + "\\boxed{\\frac{3}{4}}", "0.75") == 1.0


@pytest.mark.parametrize(
    "answer",
    [
        "9^{9^{9^{9}}}",  # symbolic evaluation explodes
        "(" * 40 + "1" + ")" * 40,  # deep nesting: the LaTeX parser backtracks exponentially
        "10^{10^{10}}-1",
    ],
)
def test_explosive_answers_score_zero_in_bounded_time(answer):
    start = time.perf_counter()
    assert reward.reward(f"\\boxed{{{answer}}}", "7") == 0.0
    assert time.perf_counter() - start < SLOW_CALL_BOUND_S


def test_hard_timeout_kills_and_restarts_the_worker(monkeypatch):
    reward.reward("\\boxed{2}", "1.999")  # make sure a worker is running
    first_worker = reward._GRADER._process.pid
    monkeypatch.setattr(reward, "GRADE_TIMEOUT_S", 0.2)  # shorter than math-verify's own 1 s timeouts
    start = time.perf_counter()
    assert not reward.answers_equivalent("1", "(" * 41 + "1" + ")" * 41)  # parsing this takes > 1 s
    assert time.perf_counter() - start < 5
    assert reward._GRADER._process is None  # killed
    monkeypatch.setattr(reward, "GRADE_TIMEOUT_S", 5.0)
    assert reward.answers_equivalent("\\frac{2}{3}", "0.666666666667")  # a new worker grades the next call
    assert reward._GRADER._process.pid != first_worker


def test_reward_from_other_threads():
    """math-verify's signal-based timeouts fail off the main thread; the worker process makes that irrelevant."""
    results = {}

    def grade(k):
        results[k] = reward.reward(f"\\boxed{{\\frac{{{k}}}{{4}}}}", str(k / 4))

    threads = [threading.Thread(target=grade, args=(k,)) for k in range(1, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=SLOW_CALL_BOUND_S)
    assert results == {k: 1.0 for k in range(1, 7)}


def test_answers_equivalent():
    assert reward.answers_equivalent("\\frac{1}{2}", "0.5")
    assert reward.answers_equivalent("0.5", "\\frac{1}{2}")
    assert reward.answers_equivalent("\\text{Monday}", "\\text{Monday}")  # identical strings, parsed or not
    assert not reward.answers_equivalent("5", "6")
    assert not reward.answers_equivalent("", "")
    assert not reward.answers_equivalent(None, "1")
    assert not reward.answers_equivalent("1" * 5000, "1" * 5000)  # over MAX_ANSWER_CHARS


def test_common_path_is_milliseconds():
    reward.reward("\\boxed{1}", "2")  # worker started
    start = time.perf_counter()
    for k in range(300, 320):  # distinct answers: no cache hits
        assert reward.reward(f"\\boxed{{{k}}}", str(k + 1)) == 0.0
    per_call = (time.perf_counter() - start) / 20
    assert per_call < 0.1, f"{per_call * 1000:.1f} ms per integer answer"
