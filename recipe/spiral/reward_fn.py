"""r(x, y) for verl: the project's grader (reward.reward) under verl's custom reward function signature.

The SPIRAL agent loop grades every aggregation trace with it (Algorithm 1, line 10); spiral_trainer.yaml also names
it as verl's `reward.custom_reward_function`, so whatever verl grades itself (a single-turn validation run, verl's
main_eval) is graded the same way. Search traces are never graded."""

from __future__ import annotations

from reward import reward


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """1.0 if the last \\boxed{} of `solution_str` equals `ground_truth` (math-verify), else 0.0."""
    return reward(solution_str, str(ground_truth))
