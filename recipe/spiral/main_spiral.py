"""The SPIRAL recipe's entry point for verl 0.9.1 (REQUIRED_VERL.txt): `python -m recipe.spiral.main_spiral`, from the
repository root (run_spiral_*.sh), with Hydra overrides as any verl entry point takes them.

verl's own main_ppo with three additions:
  1. SpiralTaskRunner, verl's TaskRunnerV1 that first registers trainer mode "spiral_sync" (verl_spiral's
     SpiralPPOTrainer: Algorithm 1's advantages) and agent loop "spiral_agent". Registration must happen inside the
     TaskRunner's Ray actor, where get_trainer_cls runs: importing verl_spiral in the driver registers nothing there.
  2. Checks before Ray starts, each a line `main_spiral.py: error: ...` and exit 2:
       check_spiral_config  the settings without which the update is not Algorithm 1's, or verl would run something
                            other than it says (config/spiral_trainer.yaml sets them all)
       check_data_files     the local data files are there
       check_task           the prompt cap holds the aggregation prompt; every row is in a layout the recipe reads
                            (verl_task.py), its gold answer one the reward can read (verl_task.gold_problem); the
                            problems that fit (spiral.max_prompt_tokens, as train.py's --max-prompt-tokens); a run
                            length verl's loop honours (verl_spiral.run_length_problem);
                            reward.custom_reward_function loads and grades the first row
       set_ray_cpus         below
       validate_config      verl's own
     A refusal raised later inside Ray (verl_spiral.SpiralConfigError) is one line too.
  3. Ray's CPU count: a local Ray gets the logical CPUs the run holds (set_ray_cpus); with fewer, Ray waits for them
     without a word (4 CPUs: the config printed, then nothing for minutes).
Without verl[verl-core] or hydra, it says so in one line naming REQUIRED_VERL.txt (its --help too).
"""

from __future__ import annotations

import math
import os
import sys

try:  # without verl, `python -m recipe.spiral.main_spiral [--help]` says what to install in one line
    import hydra
    import ray
    import transfer_queue  # noqa: F401 - verl[verl-core]: the TaskRunner's Ray actor would fail on it much later
    from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
except ImportError as exc:
    if __name__ != "__main__":
        raise
    print(f"main_spiral.py: error: {exc}: install the verl that recipe/spiral/REQUIRED_VERL.txt names, with "
          "verl[verl-core] and hydra-core (recipe/spiral/README.md)", file=sys.stderr)
    sys.exit(2)

import verl_spiral
from recipe.spiral import verl_task


def rows_per_prompt(config) -> int:
    """N1 + K N2: the rows one SPIRAL session returns (24 in the paper)."""
    s = config.spiral
    return s.num_search + s.num_sets * s.num_aggregations


def check_spiral_config(config) -> None:
    """ValueError naming the first setting that would make verl's update something other than Algorithm 1's, or make
    verl run something other than what it says."""
    from verl.trainer.ppo.utils import need_critic

    s, data, actor = config.spiral, config.data, config.actor_rollout_ref.actor
    rollout_cfg, algorithm, reward = config.actor_rollout_ref.rollout, config.algorithm, config.reward
    R = data.train_batch_size * rows_per_prompt(config)  # rows per step: |B| (N1 + K N2)
    custom_cls = data.get("custom_cls") or {}
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
        (not (algorithm.get("filter_groups") or {}).get("enable", False), "algorithm.filter_groups.enable",
         "false: verl's dynamic sampling keeps a prompt whose rows' rm_scores differ, and verl copies a session's "
         "last score onto all its N1 + K N2 rows, so every prompt would be evicted, without end (a prompt without "
         "signal trains here with advantage 0)"),
        (reward.reward_manager.source == "register" and reward.reward_manager.name == "naive",
         "reward.reward_manager.name", "naive (the agent loop calls reward.custom_reward_function itself, as verl's "
         "naive manager does; no other manager runs on aggregation rows)"),
        (all(v is None for v in config.custom_reward_function.values()), "custom_reward_function.path",
         "null: verl 0.9.1's v1 trainer ignores this legacy key; set reward.custom_reward_function.path and .name"),
        (not reward.get("sandbox_fusion", {}).get("url"), "reward.sandbox_fusion.url",
         "null: the agent loop calls reward.custom_reward_function (or verl's default_compute_score) without it"),
        (not reward.reward_model.enable, "reward.reward_model.enable",
         "false (the agent loop grades aggregation rows with reward.custom_reward_function; a reward model would not "
         "be called)"),
        (custom_cls.get("path") == "pkg://recipe.spiral.dataset" and custom_cls.get("name") == "SpiralDataset",
         "data.custom_cls", "recipe.spiral.dataset's SpiralDataset (path pkg://recipe.spiral.dataset, name "
         "SpiralDataset): SPIRAL's prompt-length filter"),
        (data.filter_overlong_prompts, "data.filter_overlong_prompts", "true (SpiralDataset drops the problems whose "
         "prompts do not fit)"),
        (s.max_prompt_tokens >= 1, "spiral.max_prompt_tokens", "at least 1"),
        (data.max_prompt_length >= s.max_prompt_tokens + s.set_size * data.max_response_length,
         "data.max_prompt_length", f"at least spiral.max_prompt_tokens + spiral.set_size x data.max_response_length "
         f"= {s.max_prompt_tokens + s.set_size * data.max_response_length}, plus the aggregation template (an "
         "aggregation prompt holds the problem and n traces; verl would cut the problem off its front)"),
    ]
    for ok, key, expected in checks:
        if not ok:
            raise ValueError(f"{key} must be {expected}")


def check_data_files(config) -> None:
    """ValueError naming the first local data.train_files / data.val_files parquet that is not there (verl itself would
    find out only after Ray has started)."""
    for key in ("train_files", "val_files"):
        for path in data_files(config, key):
            if "://" not in path and not os.path.isfile(path):
                raise ValueError(f"data.{key}: no file {path} (python -m recipe.spiral.prepare_data --out DIR writes "
                                 "the project's problem sets)")


def data_files(config, key: str) -> list[str]:
    files = config.data[key]
    return [files] if isinstance(files, str) else list(files)


def read_rows(config, key: str) -> list[dict] | None:
    """The rows of data.<key> as verl's RLHFDataset reads them (datasets, before its length filter; train_max_samples
    or val_max_samples applied as verl applies it), or None where this process cannot know them (a remote file, or a
    random subset without data.seed)."""
    import numpy as np
    import pyarrow.parquet as pq

    paths = data_files(config, key)
    if any("://" in path for path in paths):
        return None
    rows = []
    for path in paths:
        if not path.endswith((".parquet", ".json", ".jsonl")):  # as RLHFDataset._read_files_and_tokenize refuses
            raise verl_task.TaskError(f"data.{key}: {path} is not .parquet, .json or .jsonl")
        try:
            if path.endswith(".parquet"):
                rows += pq.read_table(path).to_pylist()  # the Python objects verl's datasets.load_dataset gives
            else:
                import datasets

                rows += list(datasets.load_dataset("json", data_files=path)["train"])
        except Exception as exc:  # noqa: BLE001 - not parquet, bad JSON, unreadable: one line names the file
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise verl_task.TaskError(f"data.{key}: cannot read {path} ({type(exc).__name__}: {first})") from None
    max_samples = config.data.get(f"{key.split('_')[0]}_max_samples", -1)
    if 0 < max_samples < len(rows):
        if config.data.get("shuffle", False):
            if config.data.get("seed") is None:
                return None
            return [rows[i] for i in np.random.default_rng(config.data.seed).choice(len(rows), size=max_samples,
                                                                                    replace=False)]
        rows = rows[:max_samples]
    return rows


def check_task(config) -> None:
    """verl_task.TaskError (one line) before Ray starts: a prompt cap without room for the aggregation prompt, a row
    the recipe cannot read, no problem that fits, a run verl would end early (verl_spiral.run_length_problem), a
    reward function that does not load or fails on the first training row (called once, with an empty answer)."""
    from verl.utils.config import omega_conf_to_dataclass

    try:
        tokenizer = omega_conf_to_dataclass(config.actor_rollout_ref.model).tokenizer
    except Exception as exc:  # noqa: BLE001 - a bad model path fails in many ways; one line names it
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise verl_task.TaskError(f"actor_rollout_ref.model.path {config.actor_rollout_ref.model.path}: cannot load "
                                  f"its tokenizer ({type(exc).__name__}: {first})") from None
    budget = verl_task.PromptBudget.from_config(config.spiral, config.data)
    prompt_key, chat_kwargs = config.data.prompt_key, dict(config.data.get("apply_chat_template_kwargs") or {})
    verl_task.check_budget(tokenizer, budget, chat_kwargs)
    kept = {}
    for key in ("train_files", "val_files"):
        rows = read_rows(config, key)
        if rows is None:
            continue
        default_grader = not config.reward.custom_reward_function.get("path")  # verl's default_compute_score
        for i, row in enumerate(rows):
            why = verl_task.layout_problem(row, prompt_key) or verl_task.gold_problem(row, default_grader)
            if why:
                raise verl_task.TaskError(f"data.{key} row {i}: {why} (the rows the recipe reads: "
                                          "recipe/spiral/verl_task.py)")
        kept[key] = [row for row in rows if verl_task.fits(tokenizer, row, prompt_key, budget, chat_kwargs)]
        if not kept[key]:
            raise verl_task.TaskError(f"data.{key}: none of its {len(rows)} problems fits (search prompt <= "
                                      f"spiral.max_prompt_tokens {budget.max_search_tokens} tokens, aggregation "
                                      f"prompt <= data.max_prompt_length {budget.max_prompt_length})")
        if len(kept[key]) < len(rows):
            print(f"main_spiral.py: data.{key}: {len(rows) - len(kept[key])} of {len(rows)} problems are dropped: "
                  f"prompts longer than spiral.max_prompt_tokens {budget.max_search_tokens} (search) or "
                  f"data.max_prompt_length {budget.max_prompt_length} (aggregation)")
    if "train_files" in kept:
        trainer = config.trainer
        why = verl_spiral.run_length_problem(len(kept["train_files"]), config.data.train_batch_size,
                                             trainer.total_epochs, trainer.total_training_steps)
        if why:
            raise verl_task.TaskError(why)
        check_reward_function(config, kept["train_files"][0])


def check_reward_function(config, row: dict) -> None:
    """verl_task.TaskError unless r loads and grades `row` with an empty answer (a number, or a dict with "score")."""
    import asyncio

    spec = config.reward.custom_reward_function
    name = f"reward.custom_reward_function (path {spec.get('path')}, name {spec.get('name')})"
    try:
        fn = verl_task.reward_function(config)
        asyncio.run(verl_task.score(fn, data_source=row["data_source"], solution_str="",
                                    ground_truth=row["reward_model"]["ground_truth"], extra_info=row.get("extra_info")))
    except Exception as exc:  # noqa: BLE001 - a user's function fails in any way; one line names it
        cause = exc.__cause__ if isinstance(exc, RuntimeError) and exc.__cause__ else exc  # verl wraps import errors
        text = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
        raise verl_task.TaskError(f"{name}: {type(cause).__name__}: {text} (on the first training row, with an "
                                  "empty answer)") from exc


def resolve_paths(config) -> None:
    """reward.custom_reward_function.path as an absolute path: verl loads it in Ray workers, whose working directory
    need not be this one."""
    path = config.reward.custom_reward_function.get("path")
    if path and "://" not in path and not path.startswith("pkg:"):
        config.reward.custom_reward_function.path = os.path.abspath(path)
    elif path and path.startswith("file://"):
        config.reward.custom_reward_function.path = "file://" + os.path.abspath(path[len("file://"):])


def ray_cpus_needed(config) -> int:
    """Logical CPUs verl 0.9.1 holds in Ray for this run, plus one kept free: Ray places an actor without num_cpus
    (the TaskRunner, the agent-loop and reward-loop workers) only where a CPU is free, and it then holds none.

    Held: TransferQueue's controller (1) and its SimpleStorage units (1 each), and ResourcePoolManager's
    max_colocate_count (3) per GPU. Fewer CPUs and Ray waits for them without a word (4 CPUs: no output for minutes).
    """
    from verl.single_controller.ray.base import ResourcePoolManager

    backend = config.transfer_queue.backend
    storage = backend.SimpleStorage.num_data_storage_units if backend.storage_backend == "SimpleStorage" else 0
    gpus = config.trainer.n_gpus_per_node * config.trainer.nnodes
    return 1 + storage + ResourcePoolManager.max_colocate_count * gpus + 1


def joins_a_cluster(config) -> bool:
    return bool(config.ray_kwargs.ray_init.get("address") or os.environ.get("RAY_ADDRESS"))


def set_ray_cpus(config) -> None:
    """A local Ray gets the CPUs the run holds (ray_kwargs.ray_init.num_cpus: Ray's scheduling count, not cores); an
    explicit smaller number is refused. A running cluster is checked by SpiralTaskRunner, once it is joined."""
    if joins_a_cluster(config):
        return
    need, ray_init = ray_cpus_needed(config), config.ray_kwargs.ray_init
    if ray_init.get("num_cpus") is None:
        ray_init.num_cpus = max(need, os.cpu_count() or 1)
    elif ray_init.num_cpus < need:
        raise ValueError(f"ray_kwargs.ray_init.num_cpus must be at least {need} (Ray's scheduling count, not cores: "
                         "verl_spiral's run holds one per TransferQueue actor and 3 per GPU) or null")


def register_spiral() -> type:
    """Register trainer mode "spiral_sync" and agent loop "spiral_agent" in this process; returns the trainer class."""
    import recipe.spiral.agent_loop.spiral_agent_loop  # noqa: F401 - @register("spiral_agent")

    return verl_spiral.spiral_trainer_class()


@ray.remote
class SpiralTaskRunner(TaskRunnerV1.__ray_actor_class__):
    """verl's TaskRunnerV1, with SPIRAL's trainer mode and agent loop registered in its own (Ray actor) process."""

    def run(self, config):
        register_spiral()
        if joins_a_cluster(config) and ray.cluster_resources().get("CPU", 0) < ray_cpus_needed(config):
            raise verl_spiral.SpiralConfigError(
                f"the Ray cluster has {ray.cluster_resources().get('CPU', 0):g} CPUs, the run holds "
                f"{ray_cpus_needed(config)} (one per TransferQueue actor, 3 per GPU): start its nodes with more "
                "(ray start --num-cpus)")
        return super().run(config)


def refuse(exc: BaseException) -> None:
    """One line on stderr, exit 2: `exc`'s first line (its cause's, for an error raised inside Ray)."""
    cause = getattr(exc, "cause", None) or exc
    print(f"main_spiral.py: error: {(str(cause).strip() or type(cause).__name__).splitlines()[0]}", file=sys.stderr)
    sys.exit(2)


@hydra.main(config_path="config", config_name="spiral_trainer", version_base=None)
def main(config):
    """verl's main_ppo.main with the recipe's checks (before Ray starts), Ray's CPUs, and SpiralTaskRunner."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    try:
        check_spiral_config(config)
        check_data_files(config)
        resolve_paths(config)
        check_task(config)
        set_ray_cpus(config)
        validate_config(config=config, use_reference_policy=need_reference_policy(config),
                        use_critic=need_critic(config))
    except (ValueError, AssertionError, ImportError) as exc:  # verl's validate_config asserts, or imports a rollout
        # engine that is not installed: one line, not Hydra's traceback
        refuse(exc)
    try:
        run_ppo(config, task_runner_class=SpiralTaskRunner)
    except verl_spiral.SpiralConfigError as exc:  # raised in the TaskRunner: the cause's line, not Ray's traceback
        refuse(exc)


if __name__ == "__main__":
    main()
