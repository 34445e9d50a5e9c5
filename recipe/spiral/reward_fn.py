"""r(x, y) for verl: the project's grader (reward.reward) under verl's custom reward function signature.

spiral_trainer.yaml names it as verl's `reward.custom_reward_function`, the function the SPIRAL agent loop calls on
every aggregation trace (Algorithm 1, line 10) and verl calls wherever it grades itself. To train on a task of your
own, name your function there instead (path and name, verl's signature); search traces are never graded.

gsm8k rows (verl's examples/data_preprocess/gsm8k.py writes data_source "openai/gsm8k" and a prompt asking for the
answer after "####") are graded on the "#### 72" answer, as verl's own gsm8k scorer reads it, or on a \\boxed{}
answer (the Aggregation Trace Prompt asks for one) when the trace has no "####" line. A gold answer that is still
gsm8k's worked solution ("... #### 72") is graded against its number after "####"."""

from __future__ import annotations

from reward import hash_answer, reward


def is_gsm8k(data_source, ground_truth) -> bool:
    """A row in gsm8k's layout: a gsm8k data_source (verl's "openai/gsm8k"), or a gold answer ending "#### <number>"."""
    return "gsm8k" in str(data_source).lower() or hash_answer(str(ground_truth)) is not None


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                  **kwargs) -> float:
    """1.0 if the answer of `solution_str` equals `ground_truth` (math-verify), else 0.0. The answer: the last
    \\boxed{} (MATH's layout); on a gsm8k row, the number after the last "####", else the last \\boxed{}."""
    gold = str(ground_truth)
    if is_gsm8k(data_source, gold):
        gold = hash_answer(gold) or gold
        answer = hash_answer(solution_str)
        if answer is not None:
            return reward(f"\\boxed{{{answer}}}", gold)
    return reward(solution_str, gold)
