"""The SPIRAL recipe's entry point for verl 0.9.1 (REQUIRED_VERL.txt): `python -m recipe.spiral.main_spiral`, from the
repository root (run_spiral_*.sh), with Hydra overrides as any verl entry point takes them.

verl's own main_ppo with two additions:
  1. SpiralTaskRunner, verl's TaskRunnerV1 that first registers trainer mode "spiral_sync" (verl_spiral's
     SpiralPPOTrainer: Algorithm 1's advantages) and agent loop "spiral_agent". Registration must happen inside the
     TaskRunner's Ray actor, where get_trainer_cls runs: importing verl_spiral in the driver registers nothing there.
  2. check_spiral_config: the settings without which the update is not Algorithm 1's (config/spiral_trainer.yaml sets
     them). An override that breaks one, a missing data file (check_data_files) or a setting verl's validate_config
     refuses stops here in one line (`main_spiral.py: error: ...`, exit 2), before Ray starts.
"""

from __future__ import annotations

import math
import os
import sys

import hydra
import ray
from verl.trainer.main_ppo import TaskRunnerV1, run_ppo


def rows_per_prompt(config) -> int:
    """N1 + K N2: the rows one SPIRAL session returns (24 in the paper)."""
    s = config.spiral
    return s.num_search + s.num_sets * s.num_aggregations


def check_spiral_config(config) -> None:
    """ValueError naming the first setting that would make verl's update something other than Algorithm 1's."""
    from verl.trainer.ppo.utils import need_critic

    s, data, actor = config.spiral, config.data, config.actor_rollout_ref.actor
    rollout_cfg, algorithm = config.actor_rollout_ref.rollout, config.algorithm
    R = data.train_batch_size * rows_per_prompt(config)  # rows per step: |B| (N1 + K N2)
    checks = [
        (0 < s.set_size <= s.num_search, "spiral.set_size", "between 1 and spiral.num_search"),
        (0 < s.num_sets <= math.comb(s.num_search, s.set_size), "spiral.num_sets",
         f"between 1 and C(N1, n) = {math.comb(s.num_search, s.set_size)}"),
        (config.trainer.use_v1 and config.trainer.v1.trainer_mode == "spiral_sync", "trainer.v1.trainer_mode",
         "spiral_sync (with trainer.use_v1=true): SpiralPPOTrainer computes the advantages"),
        (rollout_cfg.agent.default_agent_loop == "spiral_agent", "actor_rollout_ref.rollout.agent.default_agent_loop",
         "spiral_agent"),
        (rollout_cfg.n == 1, "actor_rollout_ref.rollout.n", "1 (one SPIRAL session returns all of a prompt's rows)"),
        (actor.ppo_epochs == 1, "actor_rollout_ref.actor.ppo_epochs", "1 (one optimizer step per batch)"),
        (actor.ppo_mini_batch_size == R, "actor_rollout_ref.actor.ppo_mini_batch_size",
         f"data.train_batch_size x (N1 + K N2) = {R} (one optimizer step per batch)"),
        (actor.use_dynamic_bsz, "actor_rollout_ref.actor.use_dynamic_bsz", "true (verl refuses a mini-batch larger "
         "than data.train_batch_size otherwise)"),
        (actor.loss_agg_mode == "seq-mean-token-sum-norm", "actor_rollout_ref.actor.loss_agg_mode",
         "seq-mean-token-sum-norm (the constant C of train.loss_normalizer)"),
        (actor.loss_scale_factor == data.max_response_length, "actor_rollout_ref.actor.loss_scale_factor",
         f"data.max_response_length = {data.max_response_length} (C = rows x L)"),
        (not actor.use_kl_loss and not algorithm.use_kl_in_reward, "actor_rollout_ref.actor.use_kl_loss",
         "false, with algorithm.use_kl_in_reward=false (SPIRAL has no KL term)"),
        (not need_critic(config), "critic.enable", "false (SPIRAL has no critic; algorithm.adv_estimator=gae builds "
         "one)"),
        (rollout_cfg.calculate_log_probs and algorithm.rollout_correction.bypass_mode
         and algorithm.rollout_correction.loss_type == "reinforce", "algorithm.rollout_correction.loss_type",
         "reinforce, with bypass_mode=true and rollout.calculate_log_probs=true (REINFORCE with importance sampling)"),
        (rollout_cfg.top_p == 1.0 and rollout_cfg.top_k in (-1, 0), "actor_rollout_ref.rollout.top_p",
         "1.0, with top_k=-1 (the loss is for plain sampling from softmax(logits / T))"),
        (data.max_prompt_length >= s.set_size * data.max_response_length, "data.max_prompt_length",
         f"at least spiral.set_size x data.max_response_length = {s.set_size * data.max_response_length} (an "
         "aggregation prompt holds n traces; verl would cut the problem off its front)"),
    ]
    for ok, key, expected in checks:
        if not ok:
            raise ValueError(f"{key} must be {expected}")


def check_data_files(config) -> None:
    """ValueError naming the first local data.train_files / data.val_files parquet that is not there (verl itself would
    find out only after Ray has started)."""
    for key in ("train_files", "val_files"):
        files = config.data[key]
        for path in [files] if isinstance(files, str) else list(files):
            if "://" not in path and not os.path.isfile(path):
                raise ValueError(f"data.{key}: no file {path} (python -m recipe.spiral.prepare_data --out DIR writes "
                                 "the project's problem sets)")


def register_spiral() -> type:
    """Register trainer mode "spiral_sync" and agent loop "spiral_agent" in this process; returns the trainer class."""
    import recipe.spiral.agent_loop.spiral_agent_loop  # noqa: F401 - @register("spiral_agent")
    import verl_spiral

    return verl_spiral.spiral_trainer_class()


@ray.remote
class SpiralTaskRunner(TaskRunnerV1.__ray_actor_class__):
    """verl's TaskRunnerV1, with SPIRAL's trainer mode and agent loop registered in its own (Ray actor) process."""

    def run(self, config):
        register_spiral()
        return super().run(config)


@hydra.main(config_path="config", config_name="spiral_trainer", version_base=None)
def main(config):
    """verl's main_ppo.main with check_spiral_config and SpiralTaskRunner."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    try:
        check_spiral_config(config)
        check_data_files(config)
        validate_config(config=config, use_reference_policy=need_reference_policy(config),
                        use_critic=need_critic(config))
    except (ValueError, AssertionError) as exc:  # verl's validate_config asserts; one line, not Hydra's traceback
        print(f"main_spiral.py: error: {(str(exc).strip() or type(exc).__name__).splitlines()[0]}", file=sys.stderr)
        sys.exit(2)
    run_ppo(config, task_runner_class=SpiralTaskRunner)


if __name__ == "__main__":
    main()
