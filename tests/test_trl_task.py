"""SpiralGRPOTrainer used as TRL's own trainers are, and trl_spiral.py's flags (skipped without trl; CI's engines
environment has it): SpiralGRPOTrainer(model, reward_funcs, args, train_dataset) calls the reward functions it is given
in TRL's signature (columns, completion ids, reward_weights, None) and never the math grader; a user's GRPOConfig is
checked against SPIRAL's pins and derived values by the one check the command line uses; every GRPOConfig field of
trl 1.16.0 is classified in trl_args.FIELDS; trl_spiral.py --reward trains on a task; and the launcher, tracker,
resume and --config mistakes are one line before anything is written.

The reward "1 iff the completion is the problem reversed" can be satisfied only by calling it: a scripted sampler
writes some reversed problems (as test_task.py's)."""

import dataclasses
import json
import os

import numpy as np
import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("peft")

import cli  # noqa: E402
import reward  # noqa: E402
import rollout  # noqa: E402
import spiral  # noqa: E402
import task  # noqa: E402
import trl_args  # noqa: E402
import trl_spiral  # noqa: E402
from advantages import spiral_advantages  # noqa: E402
from test_task import reversing_generate  # noqa: E402

from datasets import Dataset  # noqa: E402
from trl import GRPOConfig  # noqa: E402

SMALL = ["--preset", "tiny", "--batch_problems", "2", "--num_search", "3", "--set_size", "2", "--num_sets", "2",
         "--num_aggregations", "2", "--max_completion_length", "6"]
SPIRAL = trl_args.SpiralArguments(preset="tiny", batch_problems=2, num_search=3, set_size=2, num_sets=2,
                                  num_aggregations=2)
G = 3 + 2 * 2  # rows per problem


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return rollout.load_policy("tiny", device="cpu", dtype="float32")


@pytest.fixture
def no_math_grader(monkeypatch):
    calls = []

    def counted(*args, **kwargs):
        calls.append(args)
        raise AssertionError("the math grader was called on a user's task")

    for name in ("reward", "answers_equivalent", "check_grader"):
        monkeypatch.setattr(reward, name, counted)
    monkeypatch.setattr(spiral, "reward", counted)
    return calls


def user_args(tmp_path, **overrides):
    """The GRPOConfig a TRL user writes for SPIRAL's tiny settings (what trl_args.grpo_config would build)."""
    values = dict(output_dir=str(tmp_path / "run"), use_cpu=True, bf16=False, max_steps=2, learning_rate=2e-3,
                  num_generations=G, per_device_train_batch_size=2 * G, logging_steps=1, max_completion_length=12,
                  adam_beta2=0.95, save_steps=25, gradient_checkpointing=False, loss_type="dr_grpo",
                  scale_rewards="none", seed=0, report_to="none")
    return GRPOConfig(**(values | overrides))


def chat_dataset(problems=("first problem", "second one")):
    return Dataset.from_list([{"prompt": [{"role": "user", "content": p}], "level": i, "judge_hint": p[::-1]}
                              for i, p in enumerate(problems)])


# ---------------------------------------------------------------------------------------------------------------------
# Every GRPOConfig field is classified, and the check refuses exactly the pinned and derived ones


def test_every_grpo_config_field_is_classified_with_a_reason():
    fields = [f.name for f in dataclasses.fields(GRPOConfig)]
    assert len(fields) == 191  # trl 1.16.0's
    assert set(trl_args.FIELDS) == set(fields), set(fields) ^ set(trl_args.FIELDS)
    for name, rule in trl_args.FIELDS.items():
        assert rule.kind in ("honoured", "pinned", "derived", "irrelevant") and len(rule.why) > 10, name
        assert (rule.kind == "pinned") == bool(rule.values), name
        assert rule.only_if is None or trl_args.FIELDS[rule.only_if].kind == "honoured", name
    kinds = [rule.kind for rule in trl_args.FIELDS.values()]
    assert {k: kinds.count(k) for k in set(kinds)} == {"honoured": 94, "pinned": 58, "derived": 5, "irrelevant": 34}


def test_the_check_refuses_every_pinned_and_derived_field_and_no_other(tmp_path):
    args = trl_args.grpo_config(SPIRAL, output_dir=str(tmp_path / "run"))
    cfg = trl_args.spiral_train_config(SPIRAL, args)
    trl_args.check_grpo_config(args, cfg)
    refused = set()
    for name, rule in trl_args.FIELDS.items():
        if name in ("gradient_accumulation_steps", "fsdp", "warmup_steps", "lr_scheduler_kwargs"):  # honoured within
            # limits (a divisor; with vLLM; a schedule that has a warm-up, that takes the settings): tested on their own
            continue
        original = getattr(args, name)
        setattr(args, name, _another(original))
        only_if = rule.only_if and getattr(args, rule.only_if)
        if rule.only_if:
            setattr(args, rule.only_if, True)
        try:
            trl_args.check_grpo_config(args, trl_args.spiral_train_config(SPIRAL, args) if name in
                                       trl_args.TRL_NAMES.values() else cfg)
        except cli.ConfigError as exc:
            assert str(exc).startswith(f"--{name} "), (name, str(exc))
            refused.add(name)
        finally:
            setattr(args, name, original)
            if rule.only_if:
                setattr(args, rule.only_if, only_if)
    expected = {n for n, r in trl_args.FIELDS.items() if r.kind in ("pinned", "derived")}
    assert refused == expected, refused ^ expected


def _another(value):
    """A value of the same kind that no pin accepts."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 7
    return "another value"


@pytest.mark.parametrize("flag, value", [
    ("loss_type", "grpo"), ("scale_rewards", "group"), ("epsilon", "0.1"), ("epsilon_high", "0.28"),
    ("importance_sampling_level", "sequence"), ("generation_kwargs", '{"top_p": 0.9}'),
    ("chat_template_kwargs", '{"enable_thinking": false}'), ("num_train_epochs", "2"), ("delta", "1.5"),
    ("label_smoothing_factor", "0.1"), ("eval_strategy", "steps"), ("sync_ref_model", "true"),
    ("top_k", "50"), ("top_p", "0.95"), ("min_p", "0.05"), ("repetition_penalty", "1.1"),  # plain sampling only
])
def test_a_trl_flag_that_would_be_ignored_is_refused_in_one_line(flag, value, tmp_path, capsys):
    out = tmp_path / "run"
    assert trl_spiral.main(SMALL + ["--max_steps", "1", "--output_dir", str(out), f"--{flag}", value]) == 2  # a
    # flag accepted by mistake trains one short step, then fails here
    err = capsys.readouterr().err
    assert err.startswith(f"trl_spiral.py: error: --{flag} ") and "SPIRAL pins it to" in err, err
    assert err.count("\n") == 1 and not out.exists()


# ---------------------------------------------------------------------------------------------------------------------
# SpiralGRPOTrainer(model, reward_funcs, args, train_dataset)


def test_the_trainer_calls_the_user_s_trl_reward_functions_with_their_columns(tiny, tmp_path, monkeypatch,
                                                                            no_math_grader):
    model, tokenizer = tiny
    problems = ("first problem", "second one")
    monkeypatch.setattr(spiral, "generate", reversing_generate({"first problem": {0, 2}, "second one": {1}}))
    calls = []

    def reversed_reward(prompts, completions, completion_ids, judge_hint, level, trainer_state, **_):
        calls.append((prompts, completions, completion_ids, judge_hint, level))
        return [float(c[0]["content"] == h) for c, h in zip(completions, judge_hint)]

    def half_and_none(prompts, completions, **_):  # None: "not this function's", skipped as TRL skips it
        return [None if c[0]["content"] == "no" else 0.5 for c in completions]

    args = user_args(tmp_path, reward_weights=[2.0, 1.0])
    trainer = trl_spiral.SpiralGRPOTrainer(model, reward_funcs=[reversed_reward, half_and_none], args=args,
                                           train_dataset=chat_dataset(problems), processing_class=tokenizer,
                                           spiral_config=SPIRAL)
    assert len(calls) == 1 and calls[0][1] == [[{"role": "assistant", "content": ""}]]  # the probe, at construction
    assert calls[0][2] == [[tokenizer.eos_token_id]]  # TRL's type: an empty completion is its EOS token alone
    sets = []
    sample_sets = spiral.sample_sets
    monkeypatch.setattr(spiral, "sample_sets", lambda *a, **k: sets.append(sample_sets(*a, **k)) or sets[-1])
    rows = [row for row in chat_dataset(problems) for _ in range(G)]
    output = trainer._generate_and_score_completions(rows)
    # TRL's batches: one call per function and role, each with all of the step's traces of that role
    assert len(calls) == 3 and not no_math_grader
    assert [len(c[1]) for c in calls[1:]] == [2 * 3, 2 * 2 * 2]  # |B| N1 search, then |B| K N2 aggregation traces
    for prompts, completions, completion_ids, judge_hint, level in calls[1:]:
        n = len(completions)
        assert len(prompts) == len(completion_ids) == len(judge_hint) == len(level) == n
        assert level == [0] * (n // 2) + [1] * (n // 2)  # each trace with its own row's columns
        assert judge_hint == [p[0]["content"][::-1] for p in prompts]
        assert completion_ids == [[5, 6]] * n  # each completion's own token ids
    expected, reversed_values = [], []
    for problem, sets_K_n in zip(problems, sets):
        good = {"first problem": {0, 2}, "second one": {1}}[problem]
        rewards_K_N2 = np.array([[2.5 if i < sum(j in good for j in G_l) else 0.0 for i in range(2)]
                                 for G_l in sets_K_n])  # reversed: 2 x 1 + 0.5; "no": 2 x 0, None skipped
        search, aggregation = spiral_advantages(sets_K_n, rewards_K_N2=rewards_K_N2, N1=3)
        expected += [*search, *aggregation.ravel()]
        reversed_values += (rewards_K_N2.ravel() > 0).tolist()
    assert np.abs(expected).max() > 0
    assert output["advantages"].tolist() == pytest.approx(expected)
    trainer._compute_loss(trainer.model, output)
    metrics = trainer._metrics["train"]
    # every rewarded (aggregation) trace counts, repeated texts ("no", the same reversal) each with its own value
    assert metrics["rewards/reversed_reward/mean"] == [pytest.approx(np.mean(reversed_values))]
    assert metrics["rewards/reversed_reward/std"] == [pytest.approx(np.std(reversed_values, ddof=1))]
    assert metrics["rewards/half_and_none/mean"] == [0.5] and metrics["rewards/half_and_none/std"] == [0.0]
    assert metrics["reward_std"] == [pytest.approx(np.std(2.5 * np.array(reversed_values), ddof=1))]  # TRL's nanstd


def test_none_from_every_function_is_a_warning_and_a_reward_of_0_as_trl(tiny, tmp_path, monkeypatch, caplog):
    model, tokenizer = tiny
    monkeypatch.setattr(spiral, "generate", reversing_generate({"first problem": {0, 2}, "second one": {1}}))

    def only_reversed(prompts, completions, **_):  # None for "no": no function scores it
        return [None if c[0]["content"] == "no" else 1.0 for c in completions]

    trainer = trl_spiral.SpiralGRPOTrainer(model, reward_funcs=[only_reversed], args=user_args(tmp_path),
                                           train_dataset=chat_dataset(), processing_class=tokenizer,
                                           spiral_config=SPIRAL)  # the probe's empty completion: None, no error
    with caplog.at_level("WARNING", logger="trl_spiral"):
        trainer._generate_and_score_completions([row for row in chat_dataset() for _ in range(G)])
    assert "every reward function returned None for" in caplog.text and "they score 0" in caplog.text
    samples = trainer.last_rollouts.samples
    assert {s.reward for s in samples if s.role == "aggregation"} == {0.0, 1.0}  # "no" scored 0: its set's score
    metrics = trainer._metrics["train"]
    assert metrics["reward"] == [1.0] and metrics["rewards/only_reversed/mean"] == [1.0]  # TRL leaves None out


def test_a_batch_aware_reward_s_values_reach_the_traces_they_were_computed_for(tiny, tmp_path, monkeypatch):
    """Values that are not a function of the text (here: the completion's place in the call, as a group-relative or
    diversity reward's are not) stay with their traces: the repeated texts ("no", the same reversal) included."""
    model, tokenizer = tiny
    monkeypatch.setattr(spiral, "generate", reversing_generate({"first problem": {0, 2}, "second one": {1}}))

    def numbered(prompts, completions, **_):
        return [float(i) for i in range(len(completions))]

    trainer = trl_spiral.SpiralGRPOTrainer(model, reward_funcs=[numbered], args=user_args(tmp_path),
                                           train_dataset=chat_dataset(), processing_class=tokenizer,
                                           spiral_config=SPIRAL)
    trainer._generate_and_score_completions([row for row in chat_dataset() for _ in range(G)])
    samples = trainer.last_rollouts.samples
    assert [s.reward for s in samples if s.role == "aggregation"] == [float(i) for i in range(2 * 2 * 2)]
    assert trainer._metrics["train"]["rewards/numbered/mean"] == [3.5]


def test_log_metric_and_log_extra_reach_trl_s_logs_by_trace(tiny, tmp_path, monkeypatch):
    model, tokenizer = tiny
    monkeypatch.setattr(spiral, "generate", reversing_generate({"first problem": {0, 2}, "second one": {1}}))

    def judged(prompts, completions, log_metric, log_extra, **_):
        texts = [c[0]["content"] for c in completions]
        log_metric("judge/batch", float(len(texts)))
        log_extra("judge_note", [f"{t}|{len(texts)}" for t in texts])
        return [float(t != "no") for t in texts]

    trainer = trl_spiral.SpiralGRPOTrainer(model, reward_funcs=[judged], args=user_args(tmp_path, log_completions=True),
                                           train_dataset=chat_dataset(), processing_class=tokenizer,
                                           spiral_config=SPIRAL)
    trainer._generate_and_score_completions([row for row in chat_dataset() for _ in range(G)])
    assert trainer._metrics["train"]["judge/batch"] == [(2 * 3 + 2 * 2 * 2) / 2]  # the mean of its two calls
    samples = trainer.last_rollouts.samples
    batch = {"search": 2 * 3, "aggregation": 2 * 2 * 2}
    notes = list(trainer._logs["extra"]["judge_note"])  # one per row of the completions table, by its trace
    assert len(notes) == len(samples) and [n.split("|")[1] for n in notes] == [str(batch[s.role]) for s in samples]
    assert [n.split("|")[0] != "no" for n, s in zip(notes, samples) if s.role == "aggregation"] == [
        s.reward == 1.0 for s in samples if s.role == "aggregation"]

    def wrong_count(prompts, completions, log_extra, **_):
        log_extra("note", ["only one"])
        return [0.0] * len(prompts)

    trainer.reward_funcs = [wrong_count]
    with pytest.raises(task.RewardError, match=r"log_extra\('note', ...\) got 1 values in a call for 6 completions"):
        trainer._generate_and_score_completions([row for row in chat_dataset() for _ in range(G)])


@pytest.mark.slow  # a step of TRL's own trainer
def test_trl_s_own_trainer_and_spiral_s_hand_a_reward_function_the_same_things(tmp_path):
    """TRL's GRPOTrainer and SpiralGRPOTrainer, one step each on the same data and reward function: the same keywords,
    types and per-completion columns, completion_ids that decode to the completions, one call per batch."""
    from trl import GRPOTrainer

    received = {"trl": [], "spiral": []}

    def recorder(who):
        def parity(prompts, completions, completion_ids, **kwargs):
            received[who].append(dict(prompts=prompts, completions=completions, completion_ids=completion_ids,
                                      **kwargs))
            return [float(len(ids) % 2) for ids in completion_ids]

        return parity

    torch.manual_seed(0)
    model, tokenizer = rollout.load_policy("tiny", device="cpu", dtype="float32")  # TRL trains it all: its own copy
    trl_args_ = GRPOConfig(output_dir=str(tmp_path / "trl"), use_cpu=True, max_steps=1, num_generations=4,
                           per_device_train_batch_size=8, max_completion_length=6, report_to="none",
                           save_strategy="no", beta=0.0, gradient_checkpointing=False, disable_tqdm=True)
    GRPOTrainer(model, reward_funcs=recorder("trl"), args=trl_args_, train_dataset=chat_dataset(),
                processing_class=tokenizer).train()
    model, tokenizer = rollout.load_policy("tiny", device="cpu", dtype="float32")
    trainer = trl_spiral.SpiralGRPOTrainer(model, reward_funcs=recorder("spiral"), args=user_args(tmp_path),
                                           train_dataset=chat_dataset(), processing_class=tokenizer,
                                           spiral_config=SPIRAL)
    trainer._generate_and_score_completions([row for row in chat_dataset() for _ in range(G)])
    (trl_call,), (_, *spiral_calls) = received["trl"], received["spiral"]  # SPIRAL's first call: the probe
    assert len(trl_call["prompts"]) == 8 and [len(c["prompts"]) for c in spiral_calls[:2]] == [2 * 3, 2 * 2 * 2]

    def shape(call):  # each keyword's type, and its items' types down to the token ids and message keys
        out = {}
        for key, value in call.items():
            if callable(value):  # log_extra, log_metric: TRL's are bound methods, SPIRAL's per-call functions
                value = "callable"
            item = value[0] if isinstance(value, list) else None
            out[key] = (type(value).__name__, type(item).__name__ if item is not None else None,
                        type(item[0]).__name__ if isinstance(item, list) and item else None,
                        sorted(item[0]) if isinstance(item, list) and item and isinstance(item[0], dict) else None)
        return out

    for call in spiral_calls:
        assert shape(call) == shape(trl_call)
    for call in [trl_call, *spiral_calls]:
        n = len(call["prompts"])
        assert all(len(call[key]) == n for key in ("completions", "completion_ids", "level", "judge_hint"))
        assert call["judge_hint"] == [p[0]["content"][::-1] for p in call["prompts"]]  # each row's own columns
        assert [tokenizer.decode(ids, skip_special_tokens=True) for ids in call["completion_ids"]] == [
            c[0]["content"] for c in call["completions"]]
        assert type(call["trainer_state"]).__name__ == "TrainerState"


def test_the_math_grader_is_the_default_and_the_answer_column_its_gold(tiny, tmp_path, monkeypatch):
    model, tokenizer = tiny
    graded = []
    monkeypatch.setattr(spiral, "reward", lambda text, gold: graded.append((text, gold)) or 0.0)
    data = Dataset.from_list([{"prompt": "What is 1 + 1?", "answer": 2}])
    trl_spiral.SpiralGRPOTrainer(model, args=user_args(tmp_path), train_dataset=data, processing_class=tokenizer,
                                 spiral_config=SPIRAL)
    assert graded == [("", "2")]


def test_a_user_s_grpo_config_with_trl_s_group_size_is_refused_with_what_to_set(tiny, tmp_path):
    model, tokenizer = tiny
    for overrides, message in [
            (dict(num_generations=8, per_device_train_batch_size=8), "--num_generations 8: SPIRAL derives it as 7"),
            (dict(per_device_train_batch_size=21), "--per_device_train_batch_size 21: SPIRAL derives it as 14"),
            (dict(logging_steps=10), "--logging_steps 10: SPIRAL pins it to 1"),
            (dict(loss_type="dapo"), "--loss_type dapo: SPIRAL pins it to dr_grpo"),
            (dict(max_steps=-1), "--max_steps -1: SPIRAL counts optimizer steps"),
            (dict(beta=0.04), "--beta 0.04: SPIRAL pins it to 0.0"),
            (dict(lr_scheduler_type="constant", warmup_steps=3), "--warmup_steps 3: the constant schedule has no")]:
        with pytest.raises(cli.ConfigError, match=message):
            trl_spiral.SpiralGRPOTrainer(model, reward_funcs=lambda prompts, completions, **_: [0.0],
                                         args=user_args(tmp_path, **overrides), train_dataset=chat_dataset(),
                                         processing_class=tokenizer, spiral_config=SPIRAL)


def test_args_none_is_spiral_s_grpo_config(tiny, tmp_path, monkeypatch):
    model, tokenizer = tiny
    monkeypatch.chdir(tmp_path)
    trainer = trl_spiral.SpiralGRPOTrainer(model, reward_funcs=lambda prompts, completions, **_: [0.0] * len(prompts),
                                           train_dataset=chat_dataset(), processing_class=tokenizer,
                                           spiral_config=SPIRAL)
    args, cfg = trainer.args, trainer.spiral
    assert (args.num_generations, args.per_device_train_batch_size, args.learning_rate) == (G, 2 * G, cfg.lr)
    assert (args.lr_scheduler_type.value, args.loss_type, args.logging_steps) == ("constant", "dr_grpo", 1)


@pytest.mark.parametrize("function, message", [
    (lambda prompts, completions, **_: {}["gone"], "raised KeyError: 'gone'"),
    (lambda prompts, completions, **_: [float("nan")], "returned nan; expected a finite number of at most"),
    (lambda prompts, completions, **_: 1.0, "expected a list of 1 rewards"),
    (lambda prompts, completions, completion_ids, **_: [completion_ids[0] + 1], "raised TypeError"),  # TRL's ids
    (lambda prompts, completions, solution, **_: [0.0], "raised TypeError"),  # a column the data lacks
])
def test_a_reward_function_that_fails_on_the_first_row_stops_the_construction(function, message, tiny, tmp_path):
    model, tokenizer = tiny
    with pytest.raises(task.RewardError, match=message):
        trl_spiral.SpiralGRPOTrainer(model, reward_funcs=function, args=user_args(tmp_path),
                                     train_dataset=chat_dataset(), processing_class=tokenizer, spiral_config=SPIRAL)


@pytest.mark.parametrize("kwargs, message", [
    (dict(reward_funcs="some/reward-model"), "takes reward functions"),
    (dict(reward_funcs=torch.nn.Linear(2, 1)), "takes reward functions"),
    (dict(eval_dataset=Dataset.from_list([{"prompt": "x"}])), "takes no eval_dataset"),
    (dict(tools=[len]), "takes no tools"),
    (dict(train_dataset=Dataset.from_list([{"prompt": [{"role": "system", "content": "x"}]}])), "one user message"),
])
def test_what_spiral_s_rollout_cannot_take_is_refused(kwargs, message, tiny, tmp_path):
    model, tokenizer = tiny
    kwargs = dict(reward_funcs=lambda prompts, completions, **_: [0.0], train_dataset=chat_dataset()) | kwargs
    with pytest.raises(ValueError, match=message):
        trl_spiral.SpiralGRPOTrainer(model, args=user_args(tmp_path), processing_class=tokenizer, spiral_config=SPIRAL,
                                     **kwargs)


def test_spiral_s_columns_reach_trl_s_trackers_with_one_train_prefix(tiny, tmp_path, monkeypatch):
    from transformers import TrainerCallback
    from transformers.integrations.integration_utils import rewrite_logs

    model, tokenizer = tiny
    seen = []

    class Tracker(TrainerCallback):  # what TensorBoard and W&B receive, after transformers' rewrite_logs
        def on_log(self, args, state, control, logs=None, **_):
            seen.append(rewrite_logs(logs))

    trainer = trl_spiral.SpiralGRPOTrainer(model, reward_funcs=lambda prompts, completions, **_: [0.0] * len(prompts),
                                           args=user_args(tmp_path), train_dataset=chat_dataset(),
                                           processing_class=tokenizer, spiral_config=SPIRAL, callbacks=[Tracker()])
    trainer._row = {"search_accuracy": 0.5, "train/loss_normalizer": 84.0, "rollout/entropy_search": 1.0}
    trainer._stats = {"loss": 0.25, "samples": 3, "tokens": 30, "ratios": [torch.ones(3)], "entropy": {}}
    trainer.log({"loss": 0.25, "grad_norm": 1.5, "learning_rate": 2e-3})
    tags = set(seen[-1])
    assert {"train/loss_normalizer", "train/search_accuracy", "train/rollout/entropy_search", "train/loss",
            "train/samples_trained", "train/grad_norm"} <= tags
    assert not [t for t in tags if t.startswith("train/train/")], tags


# ---------------------------------------------------------------------------------------------------------------------
# trl_spiral.py: a task from the command line, and one-line errors before anything is written


REWARD_FILE = '''
import zlib
CALLS = []

def crc(problem, completion):
    CALLS.append((problem.problem, problem.fields.get("level"), completion))
    return float(zlib.crc32((problem.problem + "|" + completion).encode()) % 2)
'''


def test_trl_spiral_py_trains_on_a_reward_given_by_reward_and_records_the_engine_versions(tmp_path, no_math_grader,
                                                                                        one_thread):
    (tmp_path / "my_task.py").write_text(REWARD_FILE)
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"q": [{"role": "user", "content": f"What is {a} + 1?"}],
                                                          "level": a}) + "\n" for a in (1, 2, 3)))
    out = tmp_path / "run"
    assert trl_spiral.main(SMALL + ["--max_steps", "2", "--dataset_name", str(tmp_path / "d.jsonl"), "--data_columns",
                                    "problem=q", "--reward", f"{tmp_path}/my_task.py:crc", "--output_dir",
                                    str(out)]) == 0
    import sys
    module = next(m for m in sys.modules.values() if getattr(m, "__file__", None) == str(tmp_path / "my_task.py"))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    calls = [c for c in module.CALLS if c[2] != ""]  # the probes (empty completion) aside
    assert len(calls) == sum(r["problems_drawn"] for r in rows) * G and not no_math_grader
    assert {c[1] for c in calls} <= {1, 2, 3} and None not in {c[1] for c in calls}
    done = 0
    for row in rows:
        n = row["problems_drawn"] * G
        values = [float(__import__("zlib").crc32(f"{p}|{c}".encode()) % 2) for p, _, c in calls[done:done + n]]
        done += n
        assert row["search_accuracy"] * row["problems_drawn"] * 3 + row["aggregation_accuracy"] * \
            row["problems_drawn"] * 4 == pytest.approx(sum(values))
    config = json.loads((out / "config.json").read_text())
    versions = config["versions"]
    assert versions["trl"] == "1.16.0" and versions["peft"] == "0.21.2" and versions["accelerate"]
    assert "deepspeed" in versions and config["reward"].endswith("my_task.py:crc")


@pytest.mark.parametrize("argv, message", [
    (["--max_steps", "0"], "--max_steps 0: SPIRAL counts optimizer steps"),
    (["--learning_rate", "0"], "--learning_rate must be positive"),
    (["--lora_r", "0"], "--lora_r must be a positive integer"),
    (["--output_dir", "{tmp}/file"], "--output_dir {tmp}/file is a file"),
    (["--dataset_name", "{tmp}/missing.jsonl"], "--dataset_name {tmp}/missing.jsonl: "),
    (["--resume_from_checkpoint", "/nonexistent"], "--resume_from_checkpoint /nonexistent: no such directory"),
    (["--resume_from_checkpoint", "{tmp}"], "--resume_from_checkpoint {tmp}: not a TRL checkpoint"),
    (["--report_to", "wandb"], "--report_to wandb: it is not installed (pip install wandb)"),
    (["--reward_weights", "1.0", "2.0"], "one weight per reward function"),
    (["--reward", "no_such_module_anywhere:f"], "--reward no_such_module_anywhere:f: no module named"),
    (["--model_init_kwargs", '{{"dtype": "float16"}}'], "--model_init_kwargs: trl_spiral.py loads the model itself"),
    (["--generation_batch_size", "14"], "--generation_batch_size 14: SPIRAL derives it"),
    (["--config", "{tmp}/env.yaml"], "env: must be a mapping of NAME: value"),
])
def test_mistakes_are_one_line_naming_trl_s_flags_and_write_nothing(argv, message, tmp_path, capsys):
    (tmp_path / "file").write_text("mine")
    (tmp_path / "env.yaml").write_text("env: [WANDB_MODE, offline]\n")
    argv, message = [a.format(tmp=tmp_path) for a in argv], message.format(tmp=tmp_path)
    out = tmp_path / "run" if "--output_dir" not in argv else tmp_path / "file"
    flags = SMALL + (["--output_dir", str(out)] if "--output_dir" not in argv else [])
    assert trl_spiral.main(flags + argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("trl_spiral.py: error: ") and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists() and (tmp_path / "file").read_text() == "mine"


def test_deepspeed_from_accelerate_launch_needs_its_package_and_bf16_follows_the_launcher(tmp_path, monkeypatch,
                                                                                        capsys):
    """What `accelerate launch --config_file recipe/trl/zero3.yaml` sets: without deepspeed, one line naming the
    install; its mixed_precision bf16 makes --dtype auto bfloat16 (TRL's bf16 True, which DeepSpeed's bf16.enabled
    must match) and --dtype float32 a one-line contradiction."""
    out = tmp_path / "run"
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    find_spec = trl_args.importlib.util.find_spec
    monkeypatch.setattr(trl_args.importlib.util, "find_spec",
                        lambda name, *args: None if name == "deepspeed" else find_spec(name, *args))
    assert trl_spiral.main(SMALL + ["--output_dir", str(out)]) == 2
    assert "needs the deepspeed package: pip install deepspeed" in capsys.readouterr().err and not out.exists()
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED")
    _, args, cfg = trl_args.parse_args(SMALL + ["--output_dir", str(out)])
    assert cfg.dtype == "bfloat16" and args.bf16 is True
    assert trl_spiral.main(SMALL + ["--output_dir", str(out), "--dtype", "float32"]) == 2
    assert "--dtype float32 contradicts accelerate's mixed_precision bf16" in capsys.readouterr().err
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    assert trl_args.parse_args(SMALL + ["--output_dir", str(out)])[1].bf16 is False  # the tiny preset on a CPU


def test_the_porting_guide_s_names_exist():
    assert os.path.isfile(os.path.join(os.path.dirname(trl_args.__file__), "PORTING.md"))
    guide = open(os.path.join(os.path.dirname(trl_args.__file__), "PORTING.md")).read()
    for name in ("check_grpo_config", "grpo_config", "FIELDS", "task.trl_reward", "--reward"):
        assert name in guide, name


def test_every_column_of_the_file_reaches_the_trainer_s_dataset(tmp_path, tiny):
    """A column that the first line lacks still reaches the reward functions (datasets' from_list keeps only the first
    row's columns), and the ids stay the problems' (the data's fingerprint holds them)."""
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"problem": "What is 1 + 1?", "answer": "2", "id": 7}) + "\n"
                    + json.dumps({"problem": "What is 2 + 2?", "answer": "4", "id": "b", "note": "late"}) + "\n")
    cfg, args, problems = trl_spiral.resolve(SMALL + ["--dataset_name", str(data), "--output_dir", str(tmp_path / "r")])
    model, tokenizer = tiny
    trainer = trl_spiral.build_trainer(cfg, args, model, tokenizer, problems)
    assert trainer.train_dataset["note"] == [None, "late"] and trainer.train_dataset["id"] == ["7", "b"]
    assert [p.id for p in trainer._redraw.problems] == ["7", "b"]


def test_the_trl_prompt_is_the_mapped_problem_column_a_chat_prompt_as_the_file_holds_it(tmp_path, tiny):
    """--data_columns problem=q with a chat prompt in q: TRL's `prompt` column (what the reward functions get as
    prompts, and completions in chat format with it) is that message list, not the text SPIRAL's prompts are built
    from."""
    data = tmp_path / "d.jsonl"
    chat = [{"role": "user", "content": "What is 1 + 1?"}]
    data.write_text(2 * (json.dumps({"q": chat, "problem": "a column of the same name", "answer": "2"}) + "\n"))
    cfg, args, problems = trl_spiral.resolve(SMALL + ["--dataset_name", str(data), "--data_columns", "problem=q",
                                                      "--output_dir", str(tmp_path / "r")])
    model, tokenizer = tiny
    trainer = trl_spiral.build_trainer(cfg, args, model, tokenizer, problems)
    assert trainer.train_dataset["prompt"] == [chat, chat] and trainer._redraw.problems[0].problem == "What is 1 + 1?"


def test_a_spiral_config_and_a_grpo_config_that_disagree_are_refused(tiny, tmp_path):
    """train.py's settings that TRL also names (lr is learning_rate, L is max_completion_length, ...) must agree
    between a SPIRAL config given whole and the GRPOConfig: else which one trains is a guess."""
    model, tokenizer = tiny
    cfg = trl_args.spiral_train_config(SPIRAL, user_args(tmp_path))
    cfg.lr = 1e-4
    with pytest.raises(cli.ConfigError, match="--learning_rate 0.002 differs from the SPIRAL config's lr 0.0001"):
        trl_spiral.SpiralGRPOTrainer(model, reward_funcs=lambda prompts, completions, **_: [0.0],
                                     args=user_args(tmp_path), train_dataset=chat_dataset(),
                                     processing_class=tokenizer, spiral_config=cfg)


def test_the_trainer_hands_search_advantage_to_collect_spiral(tiny, tmp_path, monkeypatch):
    """--search_advantage own (the ablation of Algorithm 1, line 13) reaches spiral.collect_spiral; unset is SPIRAL."""
    model, tokenizer = tiny
    seen = []

    class Stop(Exception):
        pass

    def recording(*args, **kwargs):
        seen.append(kwargs["search_advantage"])
        raise Stop

    monkeypatch.setattr(spiral, "collect_spiral", recording)
    for arm, expected in ((None, "set"), ("own", "own")):
        settings = dataclasses.replace(SPIRAL, search_advantage=arm)
        trainer = trl_spiral.SpiralGRPOTrainer(model, reward_funcs=[lambda prompts, completions, **_: [0.0] *
                                                                   len(completions)],
                                               args=user_args(tmp_path / str(arm)), train_dataset=chat_dataset(),
                                               processing_class=tokenizer, spiral_config=settings)
        with pytest.raises(Stop):
            trainer._generate_and_score_completions([row for row in chat_dataset() for _ in range(G)])
        assert seen[-1] == expected
