"""reward.py: last-\\boxed{} extraction, math-verify grading (gold first), hedges, Unicode math, and the guarantees
that reward() never raises and never hangs, from any thread. Interruption, fork and start-up failures:
test_grader_reliability.py."""

import json
import os
import re
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
        ("\\boxed{1 \\boxed{3}}", "1 \\boxed{3}"),  # the last top-level box, not the box inside it
        ("\\boxed{\\boxed{3}} and \\boxed{4}", "4"),
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


def test_extract_answer_matches_a_slow_scan():
    """The last top-level box, against an obvious quadratic version on random brace soup."""

    def slow(text):
        answer, start = None, 0
        while (i := text.find("\\boxed{", start)) >= 0:
            depth, j = 1, i + len("\\boxed{")
            while j < len(text) and depth:
                if text[j] == "\\":
                    j += 2
                    continue
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                j += 1
            if depth:
                return None
            answer, start = text[i + len("\\boxed{"):j - 1].strip(), j
        return answer or None

    pieces = st.sampled_from(["\\boxed{", "{", "}", "\\{", "\\}", "1", " ", "x", "\\\\"])

    @settings(max_examples=300, derandomize=True, deadline=None)
    @given(st.lists(pieces, max_size=30).map("".join))
    def check(text):
        assert reward.extract_answer(text) == slow(text)

    check()


# Hedges: a box holding several answers scores 0, while every legitimate format still scores 1.
@pytest.mark.parametrize(
    "answer, gold",
    [
        ("1 \\lor 3", "3"),  # math-verify's fallback graded the last number of what it cannot parse
        ("1 \\vee 3", "3"),
        ("1 \\\\ 3", "3"),  # line break
        ("1 \\\\[2pt] 3", "3"),
        ("7$ $3", "3"),  # two formulas
        ("1 \\text{ or } 3", "3"),  # a list is a set: it matches a list gold only
        ("x = 1 \\text{ or } x = 3", "3"),
        ("1, 3", "3"),
        ("\\{1, 3\\}", "3"),
        ("3 \\text{ and } 5", "3"),
        ("\\pm 3", "3"),
        ("3 \\text{ (or 1)}", "3"),  # math-verify drops trailing text as a unit
        ("3 \\mbox{ or 1}", "3"),
        ("3 \\text{ (1 is also possible)}", "3"),
        ("1 \\boxed{3}", "3"),
        ("1 = 3", "3"),  # math-verify grades only the last side of an equation
        ("x = 1 = 3", "3"),
        ("1 \\cup 3", "3"),
        ("1 \\to 3", "3"),
        ("1 \\implies 3", "3"),
        ("1 | 3", "3"),
        ("1 \\& 3", "3"),
        ("1 \\text{, } 3", "3"),
        ("(1, 3)", "3"),
        ("\\frac{1}{2} \\lor \\frac{1}{3}", "\\frac{1}{3}"),
    ],
)
def test_hedged_boxes_score_zero(answer, gold):
    assert reward.reward(f"\\boxed{{{answer}}}", gold) == 0.0


@pytest.mark.parametrize(
    "answer, gold",
    [
        ("(1, 3)", "(1,3)"),  # tuples (math-verify reads this one as an open interval, gold too)
        ("[2, 5)", "[2,5)"),
        ("\\{1, 3\\}", "\\{1,3\\}"),
        ("\\{3, 1\\}", "\\{1,3\\}"),
        ("1, 3", "1,3"),
        ("7, 5, 3", "3, 5, 7"),
        ("1 \\text{ or } -2", "1,-2"),  # listing the roots with "or" is a list, not a hedge
        ("x=1 \\text{ or } x=-2", "1,-2"),
        ("3 \\text{ or } 3", "3"),  # the same answer twice
        ("x = 3", "3"),
        ("\\frac{6}{2} = 3", "3"),  # every side without unknowns equals the gold
        ("\\frac{1}{2}", "0.5"),
        ("3.", "3"),  # a sentence's full stop
        ("$3$", "3"),
        ("\\boxed{3}", "3"),
        ("3 \\text{ cm}^2", "3"),  # units
        ("5~\\text{cm}", "5"),
        ("90^\\circ", "90"),
        ("\\text{A5}_{11}", "\\text{A5}_{11}"),
        ("(0,9)\\cup(9,36)", "(0,9) \\cup (9,36)"),
        ("y=2x+3", "y = 2x + 3"),
        ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"),
        ("2\\frac{1}{2}", "2.5"),  # mixed number
    ],
)
def test_legitimate_formats_still_score_one(answer, gold):
    assert reward.reward(f"\\boxed{{{answer}}}", gold) == 1.0


@pytest.mark.parametrize(
    "answer, reason",
    [("7$ $3", "$"), ("1 \\boxed{3}", "box"), ("3 \\text{ (or 1)}", "text"), ("3", None), ("\\text{3}", None),
     ("\\text{A5}_{11}", None), ("\\$32,\\!348", None)],
)
def test_hedge_reasons(answer, reason):
    found = reward.hedge(answer)
    assert (found is None) if reason is None else (reason in found)


def _math500_golds():
    with open(os.path.join(os.path.dirname(__file__), "..", "data", "math500.jsonl")) as f:
        return [json.loads(line)["answer"] for line in f]


def test_math500_golds_grade_equal_to_themselves():
    """Through the worker, as a differently written answer would be (the identical-string shortcut bypassed):
    every other non-integer gold (pmatrix, intervals, unions, sets, text, \\$, units) and a few integers."""
    golds = _math500_golds()
    formats = [g for g in golds if not re.fullmatch(r"-?\d+", g)][::2] + golds[::50]
    failures = []
    for gold in formats:
        cleaned = reward._clean(gold)
        if reward.hedge(cleaned) or reward._GRADER.equivalent(cleaned, cleaned) is not True:
            failures.append(gold)
    assert len(formats) > 90 and failures == []


@pytest.mark.parametrize(
    "answer, gold",
    [
        ("½", "\\frac{1}{2}"),
        ("⅓", "\\frac13"),
        ("¾", "0.75"),
        ("2½", "2.5"),
        ("√2", "\\sqrt{2}"),
        ("2√3", "2\\sqrt{3}"),
        ("√(x+1)", "\\sqrt{x+1}"),
        ("∛8", "2"),
        ("π", "\\pi"),
        ("π/2", "\\frac{\\pi}{2}"),
        ("√π", "\\sqrt{\\pi}"),
        ("３", "3"),  # full-width
        ("（１，３）", "(1,3)"),
        ("ｘ＝３", "3"),
        ("−3", "-3"),  # U+2212
        ("2×3", "6"),
        ("6÷2", "3"),
        ("3·4", "12"),
        ("x≤3", "x \\le 3"),
        ("x≥3", "x \\ge 3"),
        ("x≠3", "x \\ne 3"),
        ("x²", "x^2"),
        ("10⁻³", "10^{-3}"),
        ("x₁", "x_1"),
        ("∞", "\\infty"),
        ("(−∞, 3]", "(-\\infty, 3]"),
        ("45°", "45^\\circ"),
    ],
)
def test_unicode_math_scores_against_its_latex_gold(answer, gold):
    assert reward.reward(f"\\boxed{{{answer}}}", gold) == 1.0


@pytest.mark.parametrize(
    "answer, gold", [("½", "0.4"), ("√2", "2"), ("x²", "2x"), ("３", "4"), ("−3", "3"), ("x≤3", "x \\ge 3"), ("2½", "1")]
)
def test_wrong_unicode_answers_score_zero(answer, gold):
    assert reward.reward(f"\\boxed{{{answer}}}", gold) == 0.0


def test_normalize_unicode_examples():
    assert reward.normalize_unicode("x²+½") == "x^{2}+\\frac{1}{2}"
    assert reward.normalize_unicode("√√2") == "\\sqrt{\\sqrt{2}}"
    assert reward.normalize_unicode("１２３") == "123"
    assert reward.normalize_unicode("\\frac{1}{2}") == "\\frac{1}{2}"  # ASCII is untouched


HANDLED = "".join(map(chr, reward._SYMBOLS)) + reward._SUPERSCRIPTS + reward._SUBSCRIPTS + "½⅓¼¾⅔⅕⅛" + "０９ＡＺ"


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.text(alphabet=st.sampled_from(HANDLED + "√∛x2{}()\\ -é"), max_size=20) | st.text(max_size=20))
def test_normalize_unicode_leaves_no_handled_character(text):
    out = reward.normalize_unicode(text)
    assert not any(char in HANDLED for char in out)
    assert out == text or not text.isascii()
