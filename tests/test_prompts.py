"""prompts.py: the paper's two prompts word for word (the appendix's boxes, copied here independently of prompts.py),
for any number of candidates, with braces and placeholder names in a problem or a trace inserted verbatim."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import prompts
import rollout

ROOT = Path(__file__).resolve().parents[1]

# ----------------------------------------------------------------------------------------------------------------------
# Prompts: the paper's appendix listings, copied verbatim.

PAPER_SEARCH = """{problem}

Please reason step by step, and put your final answer within \\boxed{}."""

PAPER_AGGREGATION_HEAD = """You are given a problem and several candidate solution traces. Some candidate solutions may be incorrect, incomplete, or truncated.

Problem:

{problem}

"""
PAPER_AGGREGATION_TAIL = """Your task is to audit the candidate traces and then synthesize a correct answer to the original problem.

Follow this process:

1. Briefly audit each candidate trace. Identify promising strategies, equations, intermediate results, or final answers that are explicitly supported by the visible text.
2. Note any apparent errors or unsupported leaps. If a candidate trace is truncated, use only the claims that are explicitly supported by the visible text.
3. Check the useful ideas for correctness against the original problem. Do not assume a candidate is correct just because it is confident or because multiple candidates agree.
4. After the audit, write a line exactly as follows: ### Final Solution:
5. Under that label, synthesize one coherent, self-contained final solution that can be judged without referring back to the candidates. Combine only the valid parts. If the candidates disagree, resolve the disagreement by reasoning from the original problem.

Put the final answer within \\boxed{}."""

PROBLEM = "Find $x$ if $2x + 3 = {7}$."  # braces in the problem must survive formatting


def test_search_prompt_is_the_papers():
    assert prompts.search_prompt(PROBLEM) == PAPER_SEARCH.replace("{problem}", PROBLEM)


def test_aggregation_prompt_with_four_candidates_is_the_papers_listing():
    expected = (
        PAPER_AGGREGATION_HEAD.replace("{problem}", PROBLEM)
        + "Solution 1:\nfirst {a}\n\nSolution 2:\nsecond\n\nSolution 3:\nthird\n\nSolution 4:\nfourth \\boxed{2}\n\n"
        + PAPER_AGGREGATION_TAIL
    )
    assert prompts.aggregation_prompt(PROBLEM, ["first {a}", "second", "third", "fourth \\boxed{2}"]) == expected


@pytest.mark.parametrize(
    "candidates, middle",
    [
        (["only one"], "Solution 1:\nonly one\n\n"),
        (["one", "two"], "Solution 1:\none\n\nSolution 2:\ntwo\n\n"),
    ],
)
def test_aggregation_prompt_with_one_or_two_candidates(candidates, middle):
    expected = PAPER_AGGREGATION_HEAD.replace("{problem}", PROBLEM) + middle + PAPER_AGGREGATION_TAIL
    assert prompts.aggregation_prompt(PROBLEM, candidates) == expected


def test_aggregation_prompt_rejects_no_candidates():
    with pytest.raises(ValueError):
        prompts.aggregation_prompt(PROBLEM, [])


# The templates as rollout.py built them before prompts.py existed (str.format with {{}} escapes): the rendering
# must stay byte-identical, or every trained adapter and cached evaluation would see other prompts.
OLD_SEARCH = "{problem}\n\nPlease reason step by step, and put your final answer within \\boxed{{}}."
OLD_HEADER = ("You are given a problem and several candidate solution traces. "
              "Some candidate solutions may be incorrect, incomplete, or truncated.\n\nProblem:\n\n{problem}\n\n")
OLD_CANDIDATE = "Solution {index}:\n{candidate}\n\n"


def old_aggregation(problem, candidates):
    body = "".join(OLD_CANDIDATE.format(index=i + 1, candidate=c) for i, c in enumerate(candidates))
    tail = PAPER_AGGREGATION_TAIL  # the old footer's .format() turned its {{}} into {}: the paper's text
    return OLD_HEADER.format(problem=problem) + body + tail


@pytest.mark.parametrize("seed", range(20))
def test_rendering_is_byte_identical_to_the_format_based_templates(seed):
    """Random problems and traces, with braces, backslashes and the templates' own placeholder names in them."""
    rng = np.random.default_rng(seed)
    pieces = ["{problem}", "{candidates}", "{index}", "{}", "{{", "}", "\\boxed{3}", "x", " ", "\n", "Solution 1:"]
    text = lambda: "".join(rng.choice(pieces, size=rng.integers(0, 8)))  # noqa: E731
    problem, candidates = text(), [text() for _ in range(rng.integers(1, 6))]
    assert prompts.search_prompt(problem) == OLD_SEARCH.format(problem=problem)
    assert prompts.aggregation_prompt(problem, candidates) == old_aggregation(problem, candidates)


def test_rollout_re_exports_the_same_functions():
    assert rollout.search_prompt is prompts.search_prompt
    assert rollout.aggregation_prompt is prompts.aggregation_prompt


def test_running_the_module_prints_both_prompts():
    out = subprocess.run([sys.executable, "prompts.py"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.startswith(PAPER_SEARCH) and "Solution 2:\n{candidate_solution 2}\n\n" + PAPER_AGGREGATION_TAIL in out


def test_running_the_module_with_an_argument_is_one_line_and_exit_2_and_help_prints_the_docstring():
    bad = subprocess.run([sys.executable, "prompts.py", "--bogus"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.splitlines() == ["prompts.py: error: no arguments but --help; `python prompts.py` prints the two "
                                       "prompts"]
    helped = subprocess.run([sys.executable, "prompts.py", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert helped.returncode == 0 and helped.stdout.strip() == prompts.__doc__.strip()
