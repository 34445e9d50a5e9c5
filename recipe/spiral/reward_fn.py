"""r(x, y) for verl: the project's grader (reward.reward) under verl's custom reward function signature.

spiral_trainer.yaml names it as verl's `reward.custom_reward_function`, the function the SPIRAL agent loop calls on
every aggregation trace (Algorithm 1, line 10) and verl calls wherever it grades itself. To train on a task of your
own, name your function there instead (path and name, verl's signature); search traces are never graded."""

from __future__ import annotations

from reward import reward


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                  **kwargs) -> float:
    """1.0 if the last \\boxed{} of `solution_str` equals `ground_truth` (math-verify), else 0.0."""
    return reward(solution_str, str(ground_truth))
