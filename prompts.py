"""The paper's two prompts (appendix, "Search Trace Prompt" and "Aggregation Trace Prompt"), laid out as its boxes.

Each template below is the box's text, line for line, so it can be laid beside the paper. The only departure is
that the aggregation box prints four fixed candidates ("Solution 1: {candidate_solution 1}" ... "Solution 4: ...")
where the template has one `{candidates}` slot: `aggregation_prompt` fills it with "Solution i:\\n<trace>\\n\\n" for
each of the n traces of a set G, so any n >= 1 keeps the box's layout (n = 4 gives the box exactly).

Placeholders are filled in one pass (`_fill`), not with str.format: no `{{}}` escapes in the text, and a problem or
a trace that itself contains "{candidates}" or "{problem}" is inserted verbatim, never re-expanded.
"""

import re

# Search Trace Prompt: the user message from which y_1..y_N1 ~ pi_theta(. | x) are sampled (Algorithm 1, line 2).
SEARCH_TRACE_PROMPT = r"""{problem}

Please reason step by step, and put your final answer within \boxed{}."""

# Aggregation Trace Prompt: the user message for y^G_1..y^G_N2 ~ pi_theta(. | x, G) (Algorithm 1, line 7).
# Lines are as long as the paper's: the text is the box's, word for word.
AGGREGATION_TRACE_PROMPT = r"""You are given a problem and several candidate solution traces. Some candidate solutions may be incorrect, incomplete, or truncated.

Problem:

{problem}

{candidates}Your task is to audit the candidate traces and then synthesize a correct answer to the original problem.

Follow this process:

1. Briefly audit each candidate trace. Identify promising strategies, equations, intermediate results, or final answers that are explicitly supported by the visible text.
2. Note any apparent errors or unsupported leaps. If a candidate trace is truncated, use only the claims that are explicitly supported by the visible text.
3. Check the useful ideas for correctness against the original problem. Do not assume a candidate is correct just because it is confident or because multiple candidates agree.
4. After the audit, write a line exactly as follows: ### Final Solution:
5. Under that label, synthesize one coherent, self-contained final solution that can be judged without referring back to the candidates. Combine only the valid parts. If the candidates disagree, resolve the disagreement by reasoning from the original problem.

Put the final answer within \boxed{}."""  # noqa: E501

CANDIDATE = "Solution {index}:\n{candidate}\n\n"  # one candidate of the set G, as the box prints "Solution 1:"


def _fill(template: str, **values: str) -> str:
    """Replace each {name} of `values` in one pass: the inserted text is never scanned again."""
    return re.sub(r"\{(" + "|".join(values) + r")\}", lambda m: values[m.group(1)], template)


def search_prompt(problem: str) -> str:
    """Search Trace Prompt (appendix): the user message from which y_1..y_N1 ~ pi_theta(. | x) are sampled."""
    return _fill(SEARCH_TRACE_PROMPT, problem=problem)


def aggregation_prompt(problem: str, candidates: list[str]) -> str:
    """Aggregation Trace Prompt (appendix): the user message for y^G_j ~ pi_theta(. | x, G), G = (y_1..y_n).

    The paper shows n = 4 candidates; any n >= 1 gives "Solution 1:" ... "Solution n:" in the same layout.
    Candidates are inserted verbatim (a truncated trace stays truncated: the prompt tells the model so).
    """
    if not candidates:
        raise ValueError("aggregation_prompt needs at least one candidate solution")
    body = "".join(_fill(CANDIDATE, index=str(i + 1), candidate=c) for i, c in enumerate(candidates))
    return _fill(AGGREGATION_TRACE_PROMPT, problem=problem, candidates=body)


if __name__ == "__main__":  # `python prompts.py` prints both prompts (n = 2); --help prints this module's docstring
    import sys

    if sys.argv[1:] in (["-h"], ["--help"]):
        print(__doc__)
    elif sys.argv[1:]:
        print("prompts.py: error: no arguments but --help; `python prompts.py` prints the two prompts", file=sys.stderr)
        sys.exit(2)
    else:
        print(search_prompt("{problem}") + "\n\n" + "-" * 80 + "\n\n"
              + aggregation_prompt("{problem}", ["{candidate_solution 1}", "{candidate_solution 2}"]))
