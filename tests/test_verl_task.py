"""A user's task on the verl recipe (skipped without verl[verl-core]; CI's engines environment has it): the agent loop
grades aggregation traces with the config's reward.custom_reward_function (verl's compute_score convention), reads
verl's usual row layout (gsm8k's, as verl's examples/data_preprocess writes it) as well as prepare_data's, and the
entry point refuses, in one line before Ray starts, a row it cannot read, a reward function that does not load or
fails, a prompt cap without room for the aggregation prompt, a run verl's loop would end early, and settings verl
would silently run differently (dynamic sampling, another reward manager, too few Ray CPUs). SpiralDataset keeps the
rows the entry point counts. tests/test_verl_recipe.py has the agent loop's rows, the TransferQueue and the
TaskRunner."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")

from hydra import compose, initialize_config_dir  # noqa: E402

import rollout  # noqa: E402
import verl_spiral  # noqa: E402
from recipe.spiral import main_spiral, verl_task  # noqa: E402
from tests.test_verl_recipe import TINY, N1, K, N2, n, StandInServer, prepared_row, run_agent_loop  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def composed(*overrides):
    with initialize_config_dir(config_dir=str(ROOT / "recipe/spiral/config"), version_base=None):
        return compose("spiral_trainer", overrides=[*TINY, *overrides])


@pytest.fixture(scope="module")
def tokenizer():
    return rollout.load_policy(str(ROOT / "data/tiny_warmstart"), device="cpu")[1]


def reward_file(tmp_path, body, name="r.py"):
    path = tmp_path / name
    path.write_text(body)
    return path


REVERSED = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    '''1 iff the answer is the problem written backwards.'''
    return float(solution_str.strip() == extra_info["problem"][::-1])
"""


class Reverser(StandInServer):
    """An aggregation trace of a set holding a GOOD search trace answers the problem reversed (and no \\boxed{}: the
    project's grader gives it 0); any other answers \\boxed{1}, the gold answer (the grader gives it 1)."""

    def __init__(self, tokenizer, good_search, problem):
        super().__init__(tokenizer, good_search)
        self.problem = problem

    async def generate(self, *, request_id, prompt_ids, sampling_params, **_):
        output = await super().generate(request_id=request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)
        text = self.tokenizer.decode(prompt_ids)
        if "GOOD" in text:
            output.token_ids = self.tokenizer.encode(self.problem[::-1], add_special_tokens=False) + [
                self.tokenizer.eos_token_id] * 20
        return output


# ----------------------------------------------------------------------------------------------------------------------
# r(x, y) is reward.custom_reward_function


def test_the_agent_loop_trains_on_the_configured_reward_function(tokenizer, tmp_path):
    """r = 1 iff the answer is the reversed problem: only calling the configured function can give these rewards (the
    project's grader gives the opposite ones), and the advantages follow them."""
    problem = "abc"
    config = composed(f"reward.custom_reward_function.path={reward_file(tmp_path, REVERSED)}")
    server = Reverser(tokenizer, {0}, problem)
    rows, _ = run_agent_loop(tokenizer, {0}, config, row=prepared_row(problem, answer="1"), server=server)
    fields = [r.extra_fields for r in rows]
    sets_K_n = [fields[N1 + l * N2]["set_members"] for l in range(K)]
    rewards = [f["spiral_reward"] for f in fields[N1:]]
    assert rewards == [float(0 in G) for G in sets_K_n for _ in range(N2)]
    assert 0 < sum(rewards) < len(rewards)  # both kinds of set were drawn
    adv = verl_spiral.spiral_advantages_for_verl(
        {"uid": np.array(["p"] * len(rows), dtype=object), **verl_spiral.columns_from_extra_fields(fields)},
        torch.ones(len(rows), 1))[:, 0]
    assert adv[0] > 0  # y_0 is in exactly the rewarded sets: its marginal advantage is positive


def test_a_function_s_reward_kwargs_reach_it_and_a_nan_is_refused(tmp_path):
    """Two configs naming one file with other reward.custom_reward_function.reward_kwargs are two functions (each a
    process loads once), and a NaN score is one line, never a reward."""
    path = reward_file(tmp_path, "def compute_score(data_source, solution_str, ground_truth, extra_info=None, "
                                 "scale=1.0):\n    return scale\n")
    scores = [verl_task.reward_function(composed(f"reward.custom_reward_function.path={path}",
                                                 f"+reward.custom_reward_function.reward_kwargs.scale={scale}"))(
        data_source="x", solution_str="y", ground_truth="1") for scale in (2.0, 3.0)]
    assert scores == [2.0, 3.0]
    with pytest.raises(verl_task.TaskError, match="not a finite number"):
        verl_task.score_value(float("nan"))
    assert verl_task.score_value({"score": True}) == 1.0


def test_x_is_the_last_user_message_and_a_system_message_stays_in_the_aggregation_prompt():
    """Without extra_info.problem, x is the last user message's text (verl's rows may carry an earlier exchange);
    the aggregation prompt replaces that message and keeps what came before it, a system message included."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 1 + 1?"},
                {"role": "assistant", "content": "2"}, {"role": "user", "content": "What is 3 + 4?"}]
    assert verl_task.problem_text({}, messages) == "What is 3 + 4?"
    assert verl_task.problem_text({"problem": "x"}, messages) == "x"
    aggregated = verl_task.aggregation_messages(messages, "What is 3 + 4?", ["7", "8"])
    assert aggregated[:3] == messages[:3] and len(aggregated) == 4
    assert aggregated[3] == {"role": "user", "content": rollout.aggregation_prompt("What is 3 + 4?", ["7", "8"])}


def test_a_reward_function_returning_zero_gives_zero_where_the_grader_would_give_one(tokenizer, tmp_path):
    zero = reward_file(tmp_path, "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                 "    return {'score': 0.0, 'note': 'verl reads score'}\n")
    rows, _ = run_agent_loop(tokenizer, {0, 1, 2, 3}, composed(f"reward.custom_reward_function.path={zero}"))
    assert [r.extra_fields["spiral_reward"] for r in rows[N1:]] == [0.0] * (K * N2)
    rows, _ = run_agent_loop(tokenizer, {0, 1, 2, 3}, composed())  # the shipped function: the project's grader
    assert [r.extra_fields["spiral_reward"] for r in rows[N1:]] == [1.0] * (K * N2)


# ----------------------------------------------------------------------------------------------------------------------
# verl's usual layout

QUESTION = "Natalia sold clips to 48 of her friends. How many clips did she sell?"


def gsm8k_row(index=0, **changes):
    """A row as verl's examples/data_preprocess/gsm8k.py writes it."""
    row = {"data_source": "openai/gsm8k",
           "prompt": [{"role": "user", "content": QUESTION + " Let's think step by step and output the final answer "
                                                             "after \"####\"."}],
           "ability": "math", "reward_model": {"style": "rule", "ground_truth": "1"},
           "extra_info": {"split": "train", "index": index, "answer": "48 clips.\n#### 1", "question": QUESTION}}
    row.update(changes)
    return row


class Hashes(StandInServer):
    """Answers as gsm8k's grader reads them: '#### 1' where the set holds a GOOD trace, '#### 0' otherwise."""

    async def generate(self, *, request_id, prompt_ids, sampling_params, **_):
        output = await super().generate(request_id=request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)
        text = self.tokenizer.decode(output.token_ids, skip_special_tokens=True)
        if text.startswith("so "):  # an aggregation trace
            output.token_ids = self.tokenizer.encode(f"#### {text[-2]}", add_special_tokens=False)
        return output


def test_a_row_in_verl_s_gsm8k_layout_runs_with_verl_s_own_grader(tokenizer):
    """The search prompt is the row's own chat prompt; x in the aggregation prompt is its user message; with no
    reward.custom_reward_function.path, r is verl's default_compute_score (gsm8k's '####' grader), as in verl."""
    row = gsm8k_row()
    config = composed("reward.custom_reward_function.path=null", "data.max_prompt_length=200",
                      "spiral.max_prompt_tokens=150")
    server = Hashes(tokenizer, {0})
    rows, _ = run_agent_loop(tokenizer, {0}, config, row=row, server=server)
    assert server.prompts[0] == rollout.chat_prompt_ids(tokenizer, row["prompt"][0]["content"])
    assert f"Problem:\n\n{row['prompt'][0]['content']}\n\nSolution 1:" in tokenizer.decode(server.prompts[N1])
    sets_K_n = [rows[N1 + l * N2].extra_fields["set_members"] for l in range(K)]
    assert [r.extra_fields["spiral_reward"] for r in rows[N1:]] == [float(0 in G) for G in sets_K_n for _ in range(N2)]


def test_a_gsm8k_row_with_the_shipped_yaml_s_reward_is_graded_on_its_hashes(tokenizer):
    """The shipped YAML's r (recipe/spiral/reward_fn.py) on verl's gsm8k rows: a right '#### 1' scores 1, as verl's
    own gsm8k scorer gives it (issue 40: the \\boxed{} grader scored every one 0.0, silently)."""
    config = composed("data.max_prompt_length=200", "spiral.max_prompt_tokens=150")
    assert config.reward.custom_reward_function.path == "pkg://recipe.spiral.reward_fn"
    rows, _ = run_agent_loop(tokenizer, {0}, config, row=gsm8k_row(), server=Hashes(tokenizer, {0}))
    sets_K_n = [rows[N1 + l * N2].extra_fields["set_members"] for l in range(K)]
    assert [r.extra_fields["spiral_reward"] for r in rows[N1:]] == [float(0 in G) for G in sets_K_n for _ in range(N2)]
    assert any(0 in G for G in sets_K_n)


def test_a_worked_gold_answer_is_refused_for_verl_s_default_scorer_and_read_by_the_shipped_one(tmp_path):
    """gsm8k's answer column as the gold ('48 clips.\\n#### 1'): verl's default_compute_score would compare it whole
    (every answer 0), so it is refused in one line; the shipped reward_fn and a user's function read it."""
    rows = [gsm8k_row(index=i, reward_model={"style": "rule", "ground_truth": "48 clips.\n#### 1"}) for i in range(4)]
    budget = ("spiral.max_prompt_tokens=150", "data.max_prompt_length=200")
    why = checked(tmp_path, rows, "reward.custom_reward_function.path=null", *budget)
    assert why.startswith("data.train_files row 0: reward_model.ground_truth '48 clips.\\n#### 1'... is a worked "
                          "solution") and "\n" not in why
    assert checked(tmp_path, rows, *budget) is None
    assert checked(tmp_path, [gsm8k_row(index=i) for i in range(4)], "reward.custom_reward_function.path=null",
                   *budget) is None  # verl's own rows: the number alone


@pytest.mark.parametrize("change, key", [
    ({"reward_model": {"style": "rule"}}, "reward_model.ground_truth"),
    ({"prompt": "What is 1 + 1?"}, "'prompt' is not chat messages"),
    ({"prompt": [{"role": "system", "content": "hi"}]}, "no user message"),
    ({"prompt": [{"role": "user", "content": "hi"}, {"role": "user", "content": [{"type": "image"}]}]},
     "no user message with text content (the last one is the problem)"),
    ({"extra_info": {"problem": 7}}, "extra_info.problem is int"),
])
def test_a_row_the_recipe_cannot_read_is_named_by_its_missing_key(change, key):
    assert key in verl_task.layout_problem(gsm8k_row(**change), "prompt")
    assert verl_task.layout_problem(gsm8k_row(), "prompt") is None
    assert verl_task.layout_problem(prepared_row(), "prompt") is None
    no_source = {k: v for k, v in gsm8k_row().items() if k != "data_source"}
    assert verl_task.layout_problem(no_source, "prompt") == "no data_source"


# ----------------------------------------------------------------------------------------------------------------------
# The entry point's checks, before Ray


def write_rows(path, rows):
    import pandas as pd

    pd.DataFrame(rows).to_parquet(path, index=False)
    return str(path)


def checked(tmp_path, rows, *overrides, val_rows=None):
    """check_task on `rows` as data.train_files (and val_files): the message of its refusal, or None."""
    train = write_rows(tmp_path / "train.parquet", rows)
    val = write_rows(tmp_path / "val.parquet", val_rows or rows)
    config = composed(f"data.train_files={train}", f"data.val_files={val}", *overrides)
    try:
        main_spiral.check_task(config)
    except verl_task.TaskError as exc:
        return str(exc)
    return None


def test_check_task_reads_both_layouts_and_names_a_bad_row(tmp_path, capsys):
    rows = [prepared_row(index=i) for i in range(6)] + [gsm8k_row(index=i) for i in range(6, 10)]
    assert checked(tmp_path, rows, "spiral.max_prompt_tokens=40", "data.max_prompt_length=200") is None
    rows[7] = gsm8k_row(reward_model={"style": "rule", "ground_truth": None})
    assert checked(tmp_path, rows, "spiral.max_prompt_tokens=40", "data.max_prompt_length=200") == (
        "data.train_files row 7: no reward_model.ground_truth (the rows the recipe reads: recipe/spiral/verl_task.py)")


def test_check_task_names_a_data_file_it_cannot_read(tmp_path):
    (tmp_path / "rows.csv").write_text("prompt\n")
    (tmp_path / "bad.parquet").write_text("not parquet")
    for name, message in [("rows.csv", "is not .parquet, .json or .jsonl"), ("bad.parquet", "cannot read")]:
        config = composed(f"data.train_files={tmp_path / name}")
        with pytest.raises(verl_task.TaskError, match=message):
            main_spiral.check_task(config)


def test_check_task_refuses_a_prompt_cap_without_room_for_the_aggregation_prompt(tmp_path, tokenizer):
    budget = verl_task.PromptBudget(set_size=n, response_tokens=8, max_search_tokens=40, max_prompt_length=90)
    template = verl_task.aggregation_template_tokens(tokenizer, budget)
    enough = 40 + template + n * 8
    assert checked(tmp_path, [prepared_row()] * 4, f"data.max_prompt_length={enough}") is None
    why = checked(tmp_path, [prepared_row()] * 4, f"data.max_prompt_length={enough - 1}")
    assert why.startswith("data.max_prompt_length must be at least spiral.max_prompt_tokens + the aggregation "
                          f"template + spiral.set_size x data.max_response_length = 40 + {template} + 2 x 8 = {enough}")


def test_a_row_fits_when_both_its_prompts_do_and_the_limits_are_inclusive(tokenizer):
    """fits(): the search prompt has at most spiral.max_prompt_tokens tokens (a prompt of exactly that many is kept, as
    train.py keeps it) and the aggregation prompt with n traces of L tokens at most data.max_prompt_length (a row whose
    search prompt fits but whose aggregation prompt does not is dropped: verl would cut that prompt's front)."""
    problem = "What is 3 + 4?"
    row = prepared_row(problem)
    search = len(verl_task.prompt_ids(tokenizer, row["prompt"]))
    aggregation = len(verl_task.prompt_ids(tokenizer, verl_task.aggregation_messages(row["prompt"], problem,
                                                                                     [""] * n))) + n * 8

    def fits(max_search_tokens, max_prompt_length):
        budget = verl_task.PromptBudget(set_size=n, response_tokens=8, max_search_tokens=max_search_tokens,
                                        max_prompt_length=max_prompt_length)
        return verl_task.fits(tokenizer, row, "prompt", budget)

    assert fits(search, aggregation)
    assert not fits(search - 1, aggregation) and not fits(search, aggregation - 1)


def test_long_problems_are_dropped_as_train_py_drops_them_and_spiral_dataset_keeps_the_same_rows(tmp_path, tokenizer,
                                                                                               capsys):
    """A problem whose search prompt is over spiral.max_prompt_tokens is dropped (train.py's --max-prompt-tokens),
    by the entry point's count and by verl's dataset (SpiralDataset) alike."""
    from verl.utils.dataset.rl_dataset import get_dataset_class

    long = "What is " + " + ".join(["1"] * 40) + "?"
    rows = [prepared_row(index=i) for i in range(8)] + [prepared_row(long, index=8), prepared_row(long, index=9)]
    roomy = "data.max_prompt_length=400"  # the aggregation prompt fits: only the search prompt's cap drops `long`
    assert len(rollout.chat_prompt_ids(tokenizer, rollout.search_prompt(long))) > 40
    assert len(rollout.chat_prompt_ids(tokenizer, rollout.aggregation_prompt(long, [""] * n))) + n * 8 < 400
    assert checked(tmp_path, rows, roomy) is None
    assert "data.train_files: 2 of 10 problems are dropped" in capsys.readouterr().out
    config = composed(f"data.train_files={tmp_path}/train.parquet", roomy)
    from omegaconf import OmegaConf

    OmegaConf.resolve(config)
    dataset_cls = get_dataset_class(config.data)
    assert dataset_cls.__name__ == "SpiralDataset"
    dataset = dataset_cls(config.data.train_files, tokenizer, config.data)
    assert len(dataset) == 8 and all(dataset[i]["extra_info"]["problem"] != long for i in range(8))
    assert "none of its 2 problems fits" in checked(tmp_path, [prepared_row(long)] * 2, roomy)


@pytest.mark.parametrize("overrides, message", [
    (["trainer.total_training_steps=6", "trainer.total_epochs=1"], "trainer.total_training_steps = 6 needs "
     "trainer.total_epochs >= 2: 10 problems // data.train_batch_size 2 = 5 steps an epoch"),
    (["data.train_batch_size=11", "actor_rollout_ref.actor.ppo_mini_batch_size=110"],
     "data.train_batch_size = 11 is more than the 10 training problems"),
])
def test_check_task_refuses_a_run_verl_would_end_early(tmp_path, overrides, message):
    rows = [prepared_row(index=i) for i in range(10)]
    assert checked(tmp_path, rows, "trainer.total_training_steps=10", "trainer.total_epochs=2") is None
    assert message in checked(tmp_path, rows, *overrides)


@pytest.mark.parametrize("body, name, message", [
    (None, "compute_score", "FileNotFoundError: Custom module file not found"),
    ("def other(**kw):\n    return 1.0\n", "compute_score", "AttributeError: Object not found in module"),
    ("raise ImportError('no grader here')\n", "compute_score", "ImportError: no grader here"),
    ("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1 / 0\n",
     "compute_score", "ZeroDivisionError: division by zero"),
    ("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 'yes'\n",
     "compute_score", "returned 'yes': not a finite number"),
    ("async def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.5\n",
     "compute_score", None),
])
def test_a_reward_function_that_does_not_load_or_fails_is_one_line_before_work(tmp_path, body, name, message):
    path = reward_file(tmp_path, body) if body is not None else tmp_path / "missing.py"
    why = checked(tmp_path, [prepared_row(index=i) for i in range(4)], f"reward.custom_reward_function.path={path}",
                  f"reward.custom_reward_function.name={name}")
    if message is None:
        assert why is None
    else:
        assert why.startswith(f"reward.custom_reward_function (path {path}, name {name}): ") and message in why
        assert "\n" not in why


def test_with_no_reward_function_verl_s_default_grader_must_know_the_data_source(tmp_path):
    rows = [prepared_row(index=i) for i in range(4)]
    assert "NotImplementedError" in checked(tmp_path, rows, "reward.custom_reward_function.path=null")
    assert checked(tmp_path, [gsm8k_row(index=i) for i in range(4)], "reward.custom_reward_function.path=null",
                   "data.max_prompt_length=200", "spiral.max_prompt_tokens=150") is None


@pytest.mark.parametrize("override, key", [
    ("algorithm.filter_groups.enable=true", "algorithm.filter_groups.enable must be false"),
    ("reward.reward_manager.name=dapo", "reward.reward_manager.name must be naive"),
    ("reward.reward_model.enable=true", "reward.reward_model.enable must be false"),
    ("custom_reward_function.path=mine.py", "custom_reward_function.path must be null: verl 0.9.1's v1 trainer "
     "ignores this legacy key"),
    ("reward.sandbox_fusion.url=http://localhost:8080", "reward.sandbox_fusion.url must be null"),
    ("data.custom_cls.path=null", "data.custom_cls must be"),
    ("data.filter_overlong_prompts=false", "data.filter_overlong_prompts must be true"),
    ("spiral.max_prompt_tokens=75", "data.max_prompt_length must be at least spiral.max_prompt_tokens + "
     "spiral.set_size x data.max_response_length = 91"),
])
def test_settings_verl_would_run_differently_are_refused(override, key):
    with pytest.raises(ValueError, match=key.replace("+", r"\+")):
        main_spiral.check_spiral_config(composed(override))
    main_spiral.check_spiral_config(composed())


# ----------------------------------------------------------------------------------------------------------------------
# Ray's CPUs


def test_a_local_ray_gets_the_cpus_the_run_holds(monkeypatch):
    """1 TransferQueue controller + its storage units + 3 per GPU + 1 free (for actors that hold none once placed)."""
    config = composed("trainer.n_gpus_per_node=8", "transfer_queue.backend.SimpleStorage.num_data_storage_units=8")
    assert main_spiral.ray_cpus_needed(config) == 1 + 8 + 3 * 8 + 1
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    main_spiral.set_ray_cpus(config)
    assert config.ray_kwargs.ray_init.num_cpus == 34
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    config = composed("trainer.n_gpus_per_node=8")
    main_spiral.set_ray_cpus(config)
    assert config.ray_kwargs.ray_init.num_cpus == 64  # Ray's own count where it is enough
    with pytest.raises(ValueError, match="ray_kwargs.ray_init.num_cpus must be at least 34"):
        main_spiral.set_ray_cpus(composed("trainer.n_gpus_per_node=8", "ray_kwargs.ray_init.num_cpus=4"))
    joined = composed("+ray_kwargs.ray_init.address=auto")
    main_spiral.set_ray_cpus(joined)
    assert joined.ray_kwargs.ray_init.num_cpus is None  # a running cluster: SpiralTaskRunner checks it


def test_a_refusal_raised_inside_ray_is_one_line(capsys):
    from ray.exceptions import RayTaskError

    cause = verl_spiral.SpiralConfigError("trainer.total_training_steps = 9 needs trainer.total_epochs >= 2")
    raised = RayTaskError("run", "Traceback (most recent call last):\n  many lines", cause).as_instanceof_cause()
    assert isinstance(raised, verl_spiral.SpiralConfigError)
    with pytest.raises(SystemExit) as exit_:
        main_spiral.refuse(raised)
    assert exit_.value.code == 2
    assert capsys.readouterr().err == f"main_spiral.py: error: {cause}\n"


# ----------------------------------------------------------------------------------------------------------------------
# The entry point as the run scripts start it


def run_entry_point(tmp_path, *overrides, stub_sglang=False, timeout=300):
    path = [str(ROOT)]
    if stub_sglang:  # verl's validate_config imports its vLLM rollout, and accepts a findable sglang instead
        (tmp_path / "stub/sglang").mkdir(parents=True, exist_ok=True)
        (tmp_path / "stub/sglang/__init__.py").write_text("")
        path.append(str(tmp_path / "stub"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "OMP_NUM_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, "-m", "recipe.spiral.main_spiral", *TINY, *overrides], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=timeout)


def one_error_line(done):
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if not line.startswith("WARNING:") and "Generating" not in line]
    assert len(errors) == 1 and errors[0].startswith("main_spiral.py: error: "), errors
    return errors[0]


@pytest.mark.parametrize("overrides, message", [
    (["reward.custom_reward_function.name=no_such_function"], "AttributeError: Object not found in module"),
    (["trainer.total_training_steps=60", "trainer.total_epochs=1"], "needs trainer.total_epochs >= 2"),
    (["algorithm.filter_groups.enable=true"], "algorithm.filter_groups.enable must be false"),
    (["ray_kwargs.ray_init.num_cpus=4"], "ray_kwargs.ray_init.num_cpus must be at least"),
])
def test_the_entry_point_refuses_a_user_s_task_in_one_line_before_ray_starts(tmp_path, overrides, message):
    from recipe.spiral import prepare_data

    assert prepare_data.main(["--out", str(tmp_path), "--train", "tiny_sums", "--test", "aime2024"]) == 0
    data = [f"data.train_files={tmp_path}/tiny_sums.parquet", f"data.val_files={tmp_path}/tiny_sums.parquet"]
    line = one_error_line(run_entry_point(tmp_path, *data, *overrides))
    assert message in line


@pytest.mark.slow
def test_the_entry_point_reaches_verl_s_gpu_check_with_ray_s_own_cpu_count(tmp_path):
    """Through main_spiral, Ray (started by verl, with this machine's CPU count: 2 here, where Ray would wait without
    a word for the TransferQueue's actors), SpiralTaskRunner, SpiralDataset and the trainer, up to where verl asks for
    GPUs. Not run past it: no GPU here."""
    from recipe.spiral import prepare_data

    assert prepare_data.main(["--out", str(tmp_path), "--train", "tiny_sums", "--test", "aime2024"]) == 0
    done = run_entry_point(tmp_path, f"data.train_files={tmp_path}/tiny_sums.parquet",
                           f"data.val_files={tmp_path}/tiny_sums.parquet", "actor_rollout_ref.rollout.name=sglang",
                           "transfer_queue.backend.SimpleStorage.num_data_storage_units=2", stub_sglang=True,
                           timeout=540)
    assert "SpiralDataset: 100 of 100 problems fit" in done.stdout + done.stderr
    assert "Total available GPUs 0 is less than total desired GPUs 1" in done.stderr, done.stderr[-3000:]
