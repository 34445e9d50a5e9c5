"""trl_spiral.py on the real TRL (skipped without trl; CI's engines environment has it): its advantages are
spiral_advantages, dropped problems leave advantage-0 padding rows, one step's LoRA gradient is train.py's on the same
rollouts, TRL's flags and --config work with the settings that must not change pinned, metrics.jsonl has train.py's
columns and TRL's log its own, Ctrl-C is one line and --resume_from_checkpoint equals an unbroken run, --overwrite
replaces a TRL run, two processes (torchrun, gloo) train one adapter, and bad flags are one-line errors.

The scripted sampler of test_spiral.py makes every reward known in advance for the advantage tests; the gradient and
resume tests sample the tiny model for real and grade with a pseudo-random reward (so that advantages are not all 0)."""

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("peft")

import rollout  # noqa: E402
import spiral  # noqa: E402
import train  # noqa: E402
import trl_spiral  # noqa: E402
from advantages import spiral_advantages  # noqa: E402
from problemset import Problem  # noqa: E402
from test_spiral import fake_reward, scripted_generate  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--preset", "tiny", "--batch_problems", "2", "--num_search", "3", "--set_size", "2", "--num_sets", "2",
         "--num_aggregations", "2", "--max_completion_length", "6"]
G = 3 + 2 * 2  # rows per problem


def pseudo_random_reward(text, gold):
    return float(zlib.crc32(text.encode()) % 2)


def build(tmp_path, *flags, problems=None):
    cfg, args, all_problems = trl_spiral.resolve(SMALL + ["--output_dir", str(tmp_path / "run"), *flags])
    model, tokenizer = rollout.load_policy(cfg.model, device="cpu", dtype=cfg.dtype)
    return trl_spiral.build_trainer(cfg, args, model, tokenizer, problems or all_problems)


def rows(*problems):
    return [{"prompt": p.problem, "answer": p.answer} for p in problems for _ in range(G)]


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    torch.set_num_threads(1)
    return build(tmp_path_factory.mktemp("trl"), problems=[Problem("p1", "1")])  # redraws always give p1


@pytest.fixture
def scripted(monkeypatch):
    generate, _ = scripted_generate({"p0": {0}, "p1": {1, 2}, "p2": set()})  # p2: no good trace, no signal
    drawn_sets = []

    def recording_sample_sets(*args, **kwargs):
        drawn_sets.append(original(*args, **kwargs))
        return drawn_sets[-1]

    original = spiral.sample_sets
    monkeypatch.setattr(spiral, "generate", generate)
    monkeypatch.setattr(spiral, "reward", fake_reward)
    monkeypatch.setattr(spiral, "sample_sets", recording_sample_sets)
    return drawn_sets


def expected_advantages(sets_K_n, good, N1=3, N2=2):
    """Plain loops: aggregation trace i of set G is right iff i < (good traces in G); then spiral_advantages."""
    rewards_K_N2 = np.array([[float(i < len(set(G_l) & good)) for i in range(N2)] for G_l in sets_K_n])
    search_N1, aggregation_K_N2 = spiral_advantages(sets_K_n, rewards_K_N2=rewards_K_N2, N1=N1)
    return np.concatenate([search_N1, aggregation_K_N2.ravel()])


def test_advantages_are_spiral_advantages_and_dynamic_sampling_redraws(trainer, scripted):
    trainer.log_completions = True
    try:
        output = trainer._generate_and_score_completions(rows(Problem("p0", "1"), Problem("p2", "1")))
    finally:
        trainer.log_completions = False
    # p0 kept, p2 has no signal and is replaced by a redrawn problem (p1): 3 drawn, 2 kept, every row filled.
    assert trainer.last_rollouts.metrics["problems_drawn"] == 3 and trainer.last_rollouts.metrics["problems_kept"] == 2
    assert len(scripted) == 3  # the sets of p0, p2, p1, in that order
    expected = np.concatenate([expected_advantages(scripted[0], {0}), expected_advantages(scripted[2], {1, 2})])
    assert np.abs(expected).max() > 0
    assert torch.equal(output["advantages"], torch.tensor(expected, dtype=torch.float32))
    assert output["is_search"].tolist() == ([True] * 3 + [False] * 4) * 2
    assert float(output["normalizer"]) == train.loss_normalizer(trainer.spiral, 2) == 2 * G * 6
    # What TRL logs as the advantages (its completions table) is SPIRAL's, not GRPO's.
    assert list(trainer._logs["advantages"])[-2 * G:] == pytest.approx(expected.tolist(), abs=0)


def test_dropped_problems_leave_zero_padding_rows_that_count_in_no_C(trainer, scripted):
    trainer.spiral.max_draws = 2
    try:
        output = trainer._generate_and_score_completions(rows(Problem("p0", "1"), Problem("p2", "1")))
    finally:
        trainer.spiral.max_draws = None
    assert trainer.last_rollouts.metrics["problems_kept"] == 1
    assert output["advantages"].shape == (2 * G,)  # TRL's split needs every row it asked for
    assert torch.equal(output["advantages"][G:], torch.zeros(G))
    assert torch.equal(output["advantages"][:G], torch.tensor(expected_advantages(scripted[0], {0}),
                                                              dtype=torch.float32))
    assert float(output["normalizer"]) == train.loss_normalizer(trainer.spiral, 1)
    # The padding rows are real token rows (TRL runs its forward on them) whose loss and gradient are exactly 0.
    padding = {key: (value[G:] if value.dim() else value) for key, value in output.items()}
    assert padding["completion_mask"].sum() > 0
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer._compute_loss(trainer.model, padding)
    loss.backward()
    assert float(loss) == 0.0
    assert all(p.grad is None or not p.grad.any() for p in trainer.model.parameters() if p.requires_grad)


def test_trl_s_own_columns_are_logged_next_to_spiral_s(trainer, scripted):
    trainer._metrics["train"].clear()
    output = trainer._generate_and_score_completions(rows(Problem("p0", "1"), Problem("p1", "1")))
    trainer._compute_loss(trainer.model, output)
    metrics = trainer._metrics["train"]
    samples = trainer.last_rollouts.samples
    rewards = [s.reward for s in samples if s.reward is not None]
    assert len(rewards) == 2 * 4 and 0 < np.mean(rewards) < 1
    assert metrics["reward"] == [pytest.approx(np.mean(rewards))]
    assert metrics["rewards/aggregation_reward/mean"] == metrics["reward"]
    assert metrics["reward_std"] == [pytest.approx(np.std(rewards, ddof=1))]  # the sample std, as TRL's nanstd
    sets_N2 = np.array(rewards).reshape(-1, 2)  # the aggregation traces come set by set: zero std within a set
    assert metrics["frac_reward_zero_std"] == [pytest.approx(np.mean(sets_N2.std(axis=1) == 0))]
    assert metrics["completions/mean_length"] == [pytest.approx(np.mean([len(s.completion_ids) for s in samples]))]
    eos = rollout.eos_token_ids(trainer.model, trainer.processing_class)
    ended = [len(s.completion_ids) for s in samples if s.completion_ids[-1] in eos] or [0]
    assert (metrics["completions/mean_terminated_length"], metrics["completions/max_terminated_length"]) == (
        [pytest.approx(np.mean(ended))], [max(ended)])
    assert metrics["num_tokens"][0] >= sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    assert len(metrics["entropy"]) == 1 and metrics["entropy"][0] > 0


def test_trl_s_num_tokens_counts_every_step_s_tokens_so_far(trainer, scripted):
    """TRL's num_tokens column is cumulative (prompt and completion tokens of every trained row up to this step), as
    TRL's own GRPOTrainer logs it."""
    counts = []
    for _ in range(2):
        before = trainer.state.num_input_tokens_seen
        trainer._generate_and_score_completions(rows(Problem("p0", "1"), Problem("p1", "1")))
        samples = trainer.last_rollouts.samples
        counts.append(sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples))
        assert trainer._metrics["train"]["num_tokens"] == [before + counts[-1]]
    assert counts[0] > 0 and trainer.state.num_input_tokens_seen >= sum(counts)


def test_a_role_with_no_trained_token_gets_no_entropy_column(trainer, scripted):
    """A micro-batch of advantage-0 rows only (a dropped problem's padding) trains no token of either role: the step's
    train/* columns then hold no entropy column for it (train.py's rule), never a NaN mean over nothing."""
    trainer.spiral.max_draws = 2
    try:
        output = trainer._generate_and_score_completions(rows(Problem("p0", "1"), Problem("p2", "1")))
    finally:
        trainer.spiral.max_draws = None
    padding = {key: (value[G:] if value.dim() else value) for key, value in output.items()}
    assert not padding["advantages"].any() and padding["completion_mask"].any()  # rows, none of them trained
    trainer._compute_loss(trainer.model, padding)
    columns = trainer._train_metrics()
    assert columns["train/samples_trained"] == 0 and not [k for k in columns if k.startswith("train/entropy")]
    assert all(np.isfinite(v) for v in columns.values()), columns


def test_the_search_entropy_column_is_over_trained_search_rows_only(trainer, scripted):
    """train/entropy_search and train/entropy_aggregation: the mean entropy over the tokens of the rows trained
    (advantage != 0), each role apart, as train.py's learner computes them; TRL's entropy: over all trained tokens."""
    output = trainer._generate_and_score_completions(rows(Problem("p0", "1"), Problem("p1", "1")))
    adv_B, search_B = output["advantages"], output["is_search"]
    assert ((adv_B == 0) & search_B).any() and ((adv_B != 0) & search_B).any()  # some search rows are not trained
    trainer._metrics["train"].clear()
    trainer._compute_loss(trainer.model, output)
    with torch.no_grad():
        _, entropy_BT, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([output["prompt_ids"], output["completion_ids"]], 1),
            torch.cat([output["prompt_mask"], output["completion_mask"]], 1), output["completion_ids"].size(1),
            compute_entropy=True)
    mask_BT = output["completion_mask"].bool()

    def mean(rows_B):  # plain loops over the rows and their tokens
        values = [float(entropy_BT[b, t]) for b in range(len(rows_B)) if rows_B[b] for t in range(mask_BT.size(1))
                  if mask_BT[b, t]]
        return sum(values) / len(values)

    columns = trainer._train_metrics()
    assert columns["train/entropy_search"] == pytest.approx(mean((adv_B != 0) & search_B), rel=1e-5)
    assert columns["train/entropy_aggregation"] == pytest.approx(mean((adv_B != 0) & ~search_B), rel=1e-5)
    assert trainer._metrics["train"]["entropy"] == [pytest.approx(mean(adv_B != 0), rel=1e-5)]
    assert columns["train/entropy_search"] != pytest.approx(mean(search_B), rel=1e-5)


def test_the_sampler_and_the_learner_share_temperature(tmp_path, monkeypatch):
    """--temperature reaches both halves: SPIRAL's sampler draws at it and TRL's forward divides by it, so on the
    rollout's own weights every importance ratio is 1 (at another sampling temperature they are not)."""
    torch.set_num_threads(1)
    monkeypatch.setattr(spiral, "reward", pseudo_random_reward)
    hot = build(tmp_path, "--temperature", "0.7", problems=[Problem("What is 3 + 4?", "7")])
    assert hot.spiral.temperature == hot.temperature == hot.args.temperature == 0.7
    torch.manual_seed(0)
    output = hot._generate_and_score_completions(rows(Problem("What is 3 + 4?", "7"),
                                                      Problem("Now, what is 15 + 2 + 1 + 7?", "25")))
    assert output["advantages"].any()
    hot._compute_loss(hot.model, output)
    columns = hot._train_metrics()
    assert columns["train/importance_ratio_min"] == pytest.approx(1.0, abs=1e-4)
    assert columns["train/importance_ratio_max"] == pytest.approx(1.0, abs=1e-4)


def _trl_run(out, checkpoints=(), **settings):
    """OUT/config.json of a TRL run and its checkpoint-N directories (those named in `checkpoints` complete, with
    spiral_state.json; a step given as -N: TRL wrote it but the run stopped before SPIRAL's state)."""
    cfg = train.resolve_config({"preset": "tiny", "out": str(out), **settings})
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg)))
    for step in checkpoints:
        directory = out / f"checkpoint-{abs(step)}"
        directory.mkdir()
        (directory / "trainer_state.json").write_text(json.dumps({"global_step": abs(step)}))
        if step > 0:
            state = {"numpy": np.random.default_rng(step).bit_generator.state, "data": {"epoch": 0, "index": step}}
            (directory / trl_spiral.STATE_FILE).write_text(json.dumps({"processes": [state]}))
    return cfg


def test_a_resume_continues_the_set_draws_and_the_redraws_where_the_checkpoint_left_them(trainer, tmp_path):
    """load_spiral_state: this process's entry of spiral_state.json (JSON, as the callback writes it) puts both
    streams back, so the draws after it are those an unbroken run makes."""
    saved = trainer.spiral_state()
    (tmp_path / "checkpoint-3").mkdir()
    (tmp_path / "checkpoint-3" / trl_spiral.STATE_FILE).write_text(json.dumps({"processes": [saved]}))
    draws = trainer._np_rng.random(4)
    for _ in range(3):
        trainer._redraw()
    after = trainer.spiral_state()
    assert after != saved
    trainer.load_spiral_state(str(tmp_path / "checkpoint-3"))
    assert trainer.spiral_state() == saved
    assert np.array_equal(trainer._np_rng.random(4), draws)
    for _ in range(3):
        trainer._redraw()
    assert trainer.spiral_state() == after


def test_resume_takes_the_newest_complete_checkpoint_by_step(tmp_path):
    """--resume_from_checkpoint true: the checkpoint-N of the largest N (checkpoint-10 after checkpoint-9, not string
    order) among those holding spiral_state.json (a checkpoint TRL wrote before the run stopped is not one)."""
    from types import SimpleNamespace

    latest = SimpleNamespace(resume_from_checkpoint="true", world_size=1)
    cfg = _trl_run(tmp_path / "run", checkpoints=[9, 10])
    assert trl_spiral.resume_checkpoint(cfg, latest) == str(tmp_path / "run" / "checkpoint-10")
    cfg = _trl_run(tmp_path / "stopped", checkpoints=[9, -10])
    assert trl_spiral.resume_checkpoint(cfg, latest) == str(tmp_path / "stopped" / "checkpoint-9")


def test_resume_takes_a_larger_max_steps_and_refuses_another_spiral_setting(tmp_path):
    """A resume may go on for more steps (train.RESUME_MUTABLE); another SPIRAL setting, or another number of
    processes than wrote spiral_state.json, is refused in one line."""
    from types import SimpleNamespace

    latest = SimpleNamespace(resume_from_checkpoint="latest", world_size=1)
    saved = _trl_run(tmp_path / "run", checkpoints=[2])
    longer = dataclasses.replace(saved, steps=saved.steps + 10, resume=True)
    assert trl_spiral.resume_checkpoint(longer, latest) == str(tmp_path / "run" / "checkpoint-2")
    hotter = dataclasses.replace(saved, temperature=0.5, resume=True)
    with pytest.raises(trl_spiral.cli.ConfigError, match="temperature = 0.5 differs from the run's 1.0"):
        trl_spiral.resume_checkpoint(hotter, latest)
    for setting, value in [("reward", "my_task.py:crc"), ("search_advantage", "own"), ("data_columns", "problem=q")]:
        other = dataclasses.replace(saved, **{setting: value}, resume=True)  # another task or line 13: another run
        with pytest.raises(trl_spiral.cli.ConfigError, match=f"{setting} = {value} differs from the run's"):
            trl_spiral.resume_checkpoint(other, latest)
    with pytest.raises(trl_spiral.checkpoint.CheckpointError, match="written by 1 processes, this run has 2"):
        trl_spiral.resume_checkpoint(longer, SimpleNamespace(resume_from_checkpoint="true", world_size=2))
    state_file = tmp_path / "run" / "checkpoint-2" / trl_spiral.STATE_FILE  # written by 2 processes, resumed by 1
    (state,) = json.loads(state_file.read_text())["processes"]
    state_file.write_text(json.dumps({"processes": [state, state]}))
    with pytest.raises(trl_spiral.checkpoint.CheckpointError, match="written by 2 processes, this run has 1"):
        trl_spiral.resume_checkpoint(longer, latest)


def lora_grads(model):
    return [p.grad.detach().clone() for p in model.parameters() if p.requires_grad]


def test_one_step_lora_gradient_is_train_py_s_on_the_same_rollouts(trainer, monkeypatch):
    monkeypatch.setattr(spiral, "reward", pseudo_random_reward)
    torch.manual_seed(0)
    # Prompts of different lengths, so that left padding, masks and positions matter.
    output = trainer._generate_and_score_completions(rows(Problem("What is 3 + 4?", "7"),
                                                          Problem("Now, what is 15 + 2 + 1 + 7?", "25")))
    assert output["prompt_mask"].sum(1).unique().numel() > 2
    samples = trainer.last_rollouts.samples
    assert any(s.advantage != 0 for s in samples)
    # A sampler whose log-probs differ from the learner's (as vLLM's, or bf16's), so that the ratio is not 1: the same
    # shift in TRL's tensor (samples fill its first rows, in order) and in the samples train.py trains on.
    for i, s in enumerate(samples):
        shift = [0.05 * ((i + t) % 3) for t in range(len(s.sampler_logprobs))]
        s.sampler_logprobs = [lp - d for lp, d in zip(s.sampler_logprobs, shift)]
        output["sampling_per_token_logps"][i, :len(shift)] -= torch.tensor(shift)
    model = trainer.model
    model.train()
    model.zero_grad(set_to_none=True)
    trainer._compute_loss(model, output).backward()  # what TRL's training_step differentiates
    ours = lora_grads(model)
    model.zero_grad(set_to_none=True)
    C = train.loss_normalizer(trainer.spiral, trainer.last_rollouts.metrics["problems_kept"])
    columns = train.accumulate_gradients(model, samples, loss_normalizer=C, temperature=trainer.spiral.temperature)
    reference = lora_grads(model)
    ours_columns = trainer._train_metrics()  # train.py's columns from TRL's forward: float32 rounding apart
    assert set(ours_columns) == set(columns) and ours_columns == pytest.approx(columns, rel=1e-3)
    assert columns["train/importance_ratio_min"] < columns["train/importance_ratio_max"]
    model.zero_grad(set_to_none=True)
    assert len(ours) == len(reference) == 2 * 7 * model.base_model.model.config.num_hidden_layers
    flat_ours, flat_ref = torch.cat([g.flatten() for g in ours]), torch.cat([g.flatten() for g in reference])
    assert flat_ref.norm() > 0
    # The two forwards (TRL's fused head, logprobs.py's chunked head) agree to float32 rounding, not bit for bit.
    assert (flat_ours - flat_ref).norm() <= 1e-5 * flat_ref.norm()
    assert trainer.loss_is_scaled_for_ga is True  # TRL must not divide C's loss again by the accumulation steps


def test_settings_that_change_the_update_are_train_py_s(trainer, tmp_path):
    args, cfg = trainer.args, trainer.spiral
    assert (args.learning_rate, args.lr_scheduler_type.value, args.warmup_steps) == (cfg.lr, "constant", 0)
    assert (args.adam_beta1, args.adam_beta2, args.adam_epsilon) == (0.9, 0.95, 1e-8)
    assert (args.weight_decay, args.max_grad_norm, args.beta, args.num_iterations) == (0.0, 1.0, 0.0, 1)
    assert args.steps_per_generation == args.gradient_accumulation_steps  # one optimizer step per batch
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == cfg.batch_problems * G
    assert (args.num_generations, args.logging_steps, args.save_steps) == (G, 1, 25)  # tiny: train.py's save_every
    assert (args.bf16, args.gradient_checkpointing) == (False, False)  # tiny: float32, no checkpointing
    assert (args.top_k, args.top_p, args.temperature, args.max_completion_length) == (0, 1.0, 1.0, 6)
    lora = trainer.model.peft_config["default"]
    assert (lora.r, lora.lora_alpha, lora.lora_dropout) == (32, 32.0, 0.0)
    assert set(lora.target_modules) == set(train.TARGET_MODULES)
    paper, paper_args, _ = trl_spiral.resolve(["--output_dir", str(tmp_path / "p"), "--use_cpu", "--model_name_or_path",
                                               "tiny"])
    assert paper.lr == paper_args.learning_rate == 2e-5 and paper_args.gradient_checkpointing  # the paper's
    assert (paper_args.num_generations, paper_args.per_device_train_batch_size, paper_args.save_steps) == (24, 192, 10)


def test_trl_flags_and_config_yaml_take_precedence_in_order(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("preset: tiny\nlearning_rate: 0.001\nnum_search: 3\nset_size: 2\nnum_sets: 2\n"
                      "num_aggregations: 2\nreport_to: none\nsave_steps: 3\nenv:\n  SPIRAL_TEST_ENV: from-yaml\n")
    cfg, args, _ = trl_spiral.resolve(["--config", str(recipe), "--output_dir", str(tmp_path / "r"),
                                       "--save_steps", "5", "--gradient_accumulation_steps", "2"])
    assert (cfg.preset, cfg.lr, args.learning_rate) == ("tiny", 0.001, 0.001)  # YAML over the preset
    assert args.save_steps == 5 and cfg.max_new_tokens == args.max_completion_length == 12  # flag over YAML
    assert (args.gradient_accumulation_steps, args.per_device_train_batch_size) == (2, 8 * G // 2)
    assert os.environ.pop("SPIRAL_TEST_ENV") == "from-yaml"


def test_a_warm_up_is_honoured_on_spiral_s_constant_schedule_and_a_schedule_s_settings_reach_it(tmp_path):
    """--warmup_steps with no schedule named: SPIRAL's constant becomes constant_with_warmup (transformers' constant
    would ignore the warm-up); --lr_scheduler_kwargs reach the schedule that takes them."""
    trainer = build(tmp_path, "--warmup_steps", "2", "--max_steps", "4")
    assert trainer.args.lr_scheduler_type.value == "constant_with_warmup"
    trainer.create_optimizer_and_scheduler(num_training_steps=4)
    lrs = [trainer.lr_scheduler.get_last_lr()[0]]
    for _ in range(3):
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        lrs.append(trainer.lr_scheduler.get_last_lr()[0])
    lr = trainer.args.learning_rate
    assert lrs == pytest.approx([0.0, lr / 2, lr, lr])
    _, args, _ = trl_spiral.resolve(SMALL + ["--output_dir", str(tmp_path / "c"), "--lr_scheduler_type",
                                             "cosine_with_min_lr", "--lr_scheduler_kwargs", '{"min_lr": 1e-5}'])
    assert args.lr_scheduler_kwargs == {"min_lr": 1e-5} and args.warmup_steps == 0


@pytest.mark.parametrize("argv, message", [
    (["--gradient_accumulation_steps", "5"], "--gradient_accumulation_steps must be a divisor of the 14 rows"),
    (["--beta", "0.04"], "--beta 0.04: SPIRAL pins it to 0.0 (SPIRAL has no KL term)"),
    (["--num_iterations", "2"], "--num_iterations 2: SPIRAL pins it to 1"),
    (["--top_p", "0.9"], "--top_p 0.9: SPIRAL pins it to 1.0"),
    (["--logging_steps", "5"], "--logging_steps 5.0: SPIRAL pins it to 1"),
    (["--num_generations", "8"], "--num_generations 8: SPIRAL derives it as 7"),
    (["--per_device_train_batch_size", "4"], "--per_device_train_batch_size 4: SPIRAL derives it as 14"),
    (["--bf16", "true"], "--bf16 True: SPIRAL derives it as False"),
    (["--algo", "grpo"], "unrecognized arguments: --algo grpo"),
    (["--use_vllm"], "--use_vllm needs a CUDA GPU and vllm"),
    (["--num_sets", "9"], "--num_sets 9 exceeds the C(3, 2) = 3 possible sets"),
    (["--config", "/nonexistent.yaml"], "--config /nonexistent.yaml: FileNotFoundError"),
    (["--ds3_gather_for_generation", "false"], "--ds3_gather_for_generation False: SPIRAL pins it to True"),
    (["--fsdp", "full_shard"], "FSDP needs --use_vllm"),
    (["--lr_scheduler_type", "constant", "--warmup_steps", "2"], "--warmup_steps 2: the constant schedule has no warm-up"),
    (["--lr_scheduler_kwargs", '{"num_cycles": 2}'], "the constant schedule takes no settings"),
    (["--warmup_steps", "2", "--lr_scheduler_kwargs", '{"a": 1}'], "the constant_with_warmup schedule takes no setting"),
    (["--lr_scheduler_type", "cosine", "--lr_scheduler_kwargs", '{"cycles": 2}'], "the cosine schedule refuses them"),
])
def test_bad_flags_are_one_line_errors_and_write_nothing(argv, message, tmp_path, capsys):
    out = tmp_path / "run"
    assert trl_spiral.main(SMALL + ["--max_steps", "1", "--output_dir", str(out)] + argv) == 2  # one short step if not
    err = capsys.readouterr().err
    assert err.startswith("trl_spiral.py: error: ") and message in err and err.count("\n") == 1, err
    assert not out.exists()


def test_help_and_a_bad_output_dir_from_a_terminal(tmp_path):
    """As a user runs it: --help prints TRL's and SPIRAL's flags and writes nothing; an output directory that cannot
    be written is one line on stderr (no library warning around it), exit 2, nothing written."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "default"}
    script = [sys.executable, str(ROOT / "trl_spiral.py")]
    done = subprocess.run(script + ["--help"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("usage: trl_spiral.py") and "--num_search" in done.stdout
    assert not list(tmp_path.iterdir())
    (tmp_path / "file").write_text("mine")
    done = subprocess.run(script + SMALL + ["--output_dir", str(tmp_path / "file" / "run")], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert done.stderr.startswith("trl_spiral.py: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert "is not a directory" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"] and (tmp_path / "file").read_text() == "mine"


def test_fsdp_through_accelerate_launch_without_vllm_is_refused_before_anything(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # what `accelerate launch --config_file fsdp2.yaml` sets
    assert trl_spiral.main(SMALL + ["--output_dir", str(tmp_path / "run")]) == 2
    assert "FSDP needs --use_vllm" in capsys.readouterr().err and not (tmp_path / "run").exists()


def _rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _same(row):
    return {k: v for k, v in row.items() if not k.startswith("time/")}


@pytest.mark.slow
def test_ctrl_c_is_one_line_and_resume_equals_an_unbroken_run(tmp_path, one_thread, monkeypatch, capsys):
    """4 steps with checkpoints every 2, unbroken; the same interrupted at step 4 (KeyboardInterrupt in the rollout,
    after step 3's metrics row and before its checkpoint), then --resume_from_checkpoint true from checkpoint-2: step 3
    is redone, and the metrics and the adapter are the unbroken run's, bit for bit."""
    # No signal on problems whose answer is a multiple of 3, so that dynamic sampling redraws (its stream resumes too).
    monkeypatch.setattr(spiral, "reward", lambda text, gold: 0.0 if int(gold) % 3 == 0 else pseudo_random_reward(
        text, gold))
    flags = SMALL + ["--max_steps", "4", "--save_steps", "2", "--max_completion_length", "8"]
    assert trl_spiral.main(flags + ["--output_dir", str(tmp_path / "a")]) == 0
    calls, collect = [], spiral.collect_spiral

    def interrupted_at_step_4(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return collect(*args, **kwargs)

    monkeypatch.setattr(spiral, "collect_spiral", interrupted_at_step_4)
    capsys.readouterr()
    assert trl_spiral.main(flags + ["--output_dir", str(tmp_path / "b")]) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == ("trl_spiral.py: interrupted; continue from the last checkpoint with "
                                            "--resume_from_checkpoint true (and the same flags)")
    assert "Traceback" not in err
    assert [r["step"] for r in _rows(tmp_path / "b")] == [1, 2, 3]  # step 3 logged, but not in a checkpoint
    monkeypatch.setattr(spiral, "collect_spiral", collect)
    assert trl_spiral.main(flags + ["--output_dir", str(tmp_path / "b"), "--resume_from_checkpoint", "true"]) == 0
    unbroken, resumed = _rows(tmp_path / "a"), _rows(tmp_path / "b")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]  # each step once: the metrics were cut back to step 2
    assert any(r["train/samples_trained"] for r in unbroken[2:])
    assert any(r["problems_drawn"] > r["problems_kept"] for r in unbroken[2:])  # redraws after the checkpoint
    assert [_same(r) for r in resumed] == [_same(r) for r in unbroken]
    weights = "adapter/adapter_model.safetensors"
    assert (tmp_path / "a" / weights).read_bytes() == (tmp_path / "b" / weights).read_bytes()
    # A resume with another SPIRAL setting is refused, in one line, before anything is written.
    before = (tmp_path / "b" / "metrics.jsonl").read_bytes()
    assert trl_spiral.main(flags[:-2] + ["--max_completion_length", "9", "--output_dir", str(tmp_path / "b"),
                                         "--resume_from_checkpoint", "true", "--max_steps", "6"]) == 2
    assert "max_new_tokens = 9 differs from the run's 8" in capsys.readouterr().err
    assert (tmp_path / "b" / "metrics.jsonl").read_bytes() == before


def test_an_existing_trl_run_says_which_flag_continues_it_and_overwrite_replaces_it(tmp_path, one_thread, capsys):
    out = tmp_path / "run"
    flags = SMALL + ["--max_steps", "1", "--save_steps", "1", "--output_dir", str(out)]
    assert trl_spiral.main(flags) == 0
    assert {"checkpoint-1", "metrics.jsonl", "config.json", "adapter"} <= set(os.listdir(out))
    assert trl_spiral.main(flags) == 2
    err = capsys.readouterr().err
    assert "already exists; pass --resume_from_checkpoint to continue it or --overwrite to replace it" in err
    assert trl_spiral.main(flags + ["--overwrite"]) == 0  # TRL's own checkpoint-N does not block it
    assert [r["step"] for r in _rows(out)] == [1] and not list(tmp_path.glob("run.old-*"))  # old run deleted
    train_flags = ["--preset", "tiny", "--batch-problems", "2", "--num-search", "3", "--set-size", "2", "--num-sets",
                   "2", "--num-aggregations", "2", "--max-new-tokens", "6", "--steps", "1", "--no-plot"]
    assert train.main(train_flags + ["--out", str(out), "--overwrite"]) == 0  # train.py's --overwrite too
    assert "checkpoint-1" not in os.listdir(out) and (out / "checkpoint" / "latest").is_file()
    assert trl_spiral.main(flags + ["--overwrite"]) == 0  # and back: a TRL run replaces train.py's
    (out / "notes.txt").write_text("mine")  # a user's file: --overwrite refuses, and nothing is lost
    assert trl_spiral.main(flags + ["--overwrite"]) == 2
    assert "does not look like a run directory (a run does not write notes.txt)" in capsys.readouterr().err
    assert (out / "notes.txt").read_text() == "mine"


def test_a_resume_from_the_checkpoint_at_max_steps_trains_nothing_and_leaves_the_run_as_it_was(tmp_path, one_thread,
                                                                                               capsys):
    """A finished run resumed (or one killed after its last save, before OUT/adapter): no step max_steps + 1, no
    metrics row, the adapter the run ended with (transformers' loop would train one more step)."""
    import shutil

    out = tmp_path / "run"
    flags = SMALL + ["--max_steps", "2", "--save_steps", "2", "--output_dir", str(out)]
    assert trl_spiral.main(flags) == 0
    adapter = sorted(p.name for p in (out / "adapter").iterdir())
    before = {p: p.read_bytes() for p in [out / "metrics.jsonl", out / "adapter" / "adapter_model.safetensors"]}
    capsys.readouterr()
    assert trl_spiral.main(flags + ["--resume_from_checkpoint", "true"]) == 0
    printed = capsys.readouterr().out
    assert "is at --max_steps 2: nothing left to train" in printed and "step 3/2" not in printed
    assert all(p.read_bytes() == b for p, b in before.items())
    shutil.rmtree(out / "adapter")  # as if killed after its last save, before the adapter was written
    assert trl_spiral.main(flags + ["--resume_from_checkpoint", "true"]) == 0
    assert sorted(p.name for p in (out / "adapter").iterdir()) == adapter
    assert all(p.read_bytes() == b for p, b in before.items())


def test_push_to_hub_failures_are_one_line_and_leave_a_directory_a_start_or_a_resume_can_use(tmp_path, one_thread,
                                                                                              capsys, monkeypatch):
    """No network: refused before anything is written (a plain start then works); uploads that fail mid-run (each
    checkpoint's, the adapter's) are one line at the end of a run that completed, checkpoints and adapter written."""
    import huggingface_hub
    import transformers

    def unreachable(*args, **kwargs):
        raise huggingface_hub.errors.OfflineModeIsEnabled("Name or service not known")

    out = tmp_path / "run"
    flags = SMALL + ["--max_steps", "2", "--save_steps", "1", "--output_dir", str(out)]
    monkeypatch.setattr(huggingface_hub, "create_repo", unreachable)
    assert trl_spiral.main(flags + ["--push_to_hub", "true"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trl_spiral.py: error: --push_to_hub: the Hub repository run cannot be created")
    assert err.count("\n") == 1 and not out.exists()
    monkeypatch.setattr(huggingface_hub, "create_repo", lambda *a, **k: None)  # the Hub answers, then the network goes
    monkeypatch.setattr(transformers.Trainer, "init_hf_repo", lambda self, *a, **k: None)
    monkeypatch.setattr(transformers.Trainer, "_push_from_checkpoint", unreachable)
    monkeypatch.setattr(transformers.Trainer, "push_to_hub", unreachable)
    assert trl_spiral.main(flags + ["--push_to_hub", "true"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trl_spiral.py: error: --push_to_hub: an upload to the Hub failed (OfflineModeIsEnabled: ")
    assert err.count("\n") == 1 and [row["step"] for row in _rows(out)] == [1, 2]
    assert (out / "checkpoint-2" / trl_spiral.STATE_FILE).exists() and (out / "adapter").is_dir()
    assert trl_spiral.main(flags + ["--max_steps", "3", "--resume_from_checkpoint", "true"]) == 0  # resumable


@pytest.mark.slow
def test_ctrl_c_from_a_terminal_is_one_line(tmp_path):
    """A real SIGINT once step 2 is printed (so checkpoint-1 is complete): exit 130, the one line, no traceback; the
    run then resumes from its last complete checkpoint."""
    out = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "trl_spiral.py"), *SMALL, "--max_steps", "50", "--save_steps", "1",
           "--output_dir", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    # SIGINT at its default, as a terminal starts a process: run in the background (`nohup bash .ci/run &`) the test
    # inherits it ignored, and trl_spiral.py then trained all 50 steps and exited 0
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for line in proc.stdout:
        if line.startswith("trl_spiral.py: step 2/"):
            break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1].startswith("trl_spiral.py: interrupted;") and "Traceback" not in err
    done = subprocess.run(cmd[:-6] + ["--max_steps", "3", "--output_dir", str(out), "--resume_from_checkpoint",
                                      "true", "--save_steps", "1"], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert [r["step"] for r in _rows(out)] == [1, 2, 3]


@pytest.mark.slow
def test_two_processes_train_one_adapter_and_write_metrics_once(tmp_path):
    """torchrun with 2 CPU processes (gloo): process 0 alone locks and writes OUT; DDP keeps the adapters equal."""
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           "29517", str(ROOT / "trl_spiral.py"), *SMALL, "--max_steps", "3", "--save_steps", "2",
                           "--output_dir", str(out)], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "in use by another" not in done.stderr
    assert [r["step"] for r in _rows(out)] == [1, 2, 3]  # written once, by process 0
    assert done.stdout.count("trl_spiral.py: step 3/3") == 1
    assert "the same adapter on all 2 processes" in done.stdout
    state = json.loads((out / "checkpoint-2" / trl_spiral.STATE_FILE).read_text())
    assert len(state["processes"]) == 2 and state["processes"][0]["numpy"] != state["processes"][1]["numpy"]
    config = json.loads((out / "config.json").read_text())
    assert config["trl"]["per_device_train_batch_size"] == 2 * G  # |B| problems per process


# One rollout and loss on each of two processes, as SpiralGRPOTrainer runs them under DDP; the gradient is averaged
# over the processes as DDP averages it (an all-reduce), then compared on process 0 with train.py's on every
# process's samples at C of all kept problems. Process 1 draws a problem without signal (gold a multiple of 3).
TWO_PROCESSES = """
import json, os, sys, zlib
sys.path[:0] = [{root!r}, {tests!r}]
import numpy as np, torch
from accelerate.utils import gather_object
import rollout, spiral, train, trl_spiral
from problemset import Problem
from test_trl_spiral import SMALL, rows

torch.set_num_threads(1)
spiral.reward = lambda text, gold: 0.0 if int(gold) % 3 == 0 else float(zlib.crc32(text.encode()) % 2)
cfg, args, _ = trl_spiral.resolve(SMALL + ["--output_dir", {out!r}, "--max_steps", "1"])
problems = [Problem("What is 3 + 4?", "7"), Problem("What is 6 + 8?", "14"), Problem("What is 1 + 2?", "3")]
model, tokenizer = rollout.load_policy(cfg.model, device="cpu", dtype=cfg.dtype)
trainer = trl_spiral.build_trainer(cfg, args, model, tokenizer, problems)
rank, world = trainer.accelerator.process_index, trainer.accelerator.num_processes
torch.manual_seed(rank + 1)  # seeds under which both of process 0's problems carry signal
output = trainer._generate_and_score_completions(rows(*(problems[:2] if rank == 0 else problems[1:])))
trainer.model.train()
trainer._compute_loss(trainer.model, output).backward()
lora = [p for p in trainer.model.parameters() if p.requires_grad]
ours = torch.cat([p.grad.flatten() for p in lora])
torch.distributed.all_reduce(ours)
ours /= world  # DDP's average
samples = gather_object(trainer.last_rollouts.samples)
metrics = gather_object([trainer.last_rollouts.metrics])
# Each process resumes its own set-draw stream: states saved now, the streams moved on, then loaded back.
states = gather_object([trainer.spiral_state()])
if rank == 0:
    os.makedirs({out!r} + "/checkpoint-1")
    trl_spiral.write_json_atomic({out!r} + "/checkpoint-1/" + trl_spiral.STATE_FILE, {{"processes": states}})
torch.distributed.barrier()
trainer._np_rng.random(5)
trainer._redraw()
trainer.load_spiral_state({out!r} + "/checkpoint-1")
resumed = trainer.spiral_state() == states[rank]
if rank == 0:
    trainer.model.zero_grad(set_to_none=True)
    kept = sum(m["problems_kept"] for m in metrics)
    train.accumulate_gradients(trainer.model, samples, loss_normalizer=train.loss_normalizer(cfg, kept),
                               temperature=cfg.temperature)
    reference = torch.cat([p.grad.flatten() for p in lora])
    rewards = [s.reward for s in samples if s.reward is not None]
    print("RESULT " + json.dumps({{
        "drawn": [m["problems_drawn"] for m in metrics], "kept": [m["problems_kept"] for m in metrics],
        "normalizer": float(output["normalizer"]), "C": train.loss_normalizer(cfg, kept), "world": world,
        "error": float((ours - reference).norm() / reference.norm()), "reference_norm": float(reference.norm()),
        "reward": trainer._metrics["train"]["reward"][-1], "reward_all": float(np.mean(rewards))}}))
print("RESUMED " + json.dumps([rank, resumed]), flush=True)
"""


@pytest.mark.slow
def test_two_processes_add_up_to_train_py_s_gradient_over_all_their_problems(tmp_path):
    """Two processes (torchrun, gloo) with different kept counts (process 1's second problem has no signal, and with
    several processes nothing is redrawn): each divides its loss by C / 2, C = loss_normalizer(all kept problems), so
    that DDP's average is train.py's gradient over every process's samples; TRL's reward column is over all processes'
    rows; each process resumes its own set-draw stream."""
    script = tmp_path / "two.py"
    script.write_text(TWO_PROCESSES.format(root=str(ROOT), tests=str(ROOT / "tests"), out=str(tmp_path / "run")))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           "29518", str(script)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (result,) = [json.loads(line[7:]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert sorted(json.loads(line[8:]) for line in done.stdout.splitlines() if line.startswith("RESUMED ")) == [
        [0, True], [1, True]]
    assert result["world"] == 2 and result["drawn"] == [2, 2] and result["kept"] == [2, 1]  # no redraw
    assert result["normalizer"] == result["C"] / 2 == train.loss_normalizer(
        trl_spiral.resolve(SMALL + ["--output_dir", str(tmp_path / "x")])[0], 3) / 2
    assert result["reference_norm"] > 0 and result["error"] <= 1e-5, result
    assert result["reward"] == pytest.approx(result["reward_all"])


@pytest.mark.slow
def test_a_short_run_learns_and_logs_train_py_s_columns(tmp_path, one_thread, caplog, monkeypatch):
    """Two problems, so that ten steps of 2 x 16 aggregation traces show learning (0.22 -> 0.97 when measured)."""
    data = tmp_path / "two.jsonl"
    data.write_text('{"problem": "What is 3 + 4?", "answer": "7"}\n{"problem": "What is 6 + 8?", "answer": "14"}\n')
    out = tmp_path / "trl"
    caplog.set_level(logging.WARNING)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # what a user sees: each warning once per place that raises it
        assert trl_spiral.main(["--preset", "tiny", "--max_steps", "10", "--batch_problems", "2", "--dataset_name",
                                str(data), "--output_dir", str(out)]) == 0
    rows_ = _rows(out)
    assert [r["step"] for r in rows_] == list(range(1, 11))
    first, last = (np.mean([r["aggregation_accuracy"] for r in part]) for part in (rows_[:3], rows_[-3:]))
    assert last >= first + 0.3, (first, last)
    # No warning repeats step after step (TRL's GRPO scoring logs one for every step with reward-less search rows).
    messages = [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records]
    assert not [m for m in set(messages) if messages.count(m) >= 5]
    # The same columns as train.py's metrics.jsonl on the same settings (a pseudo-random reward, so that it trains).
    monkeypatch.setattr(spiral, "reward", pseudo_random_reward)
    train_flags = ["--preset", "tiny", "--batch-problems", "2", "--num-search", "3", "--set-size", "2", "--num-sets",
                   "2", "--num-aggregations", "2", "--max-new-tokens", "6"]
    assert train.main(train_flags + ["--steps", "1", "--no-plot", "--out", str(tmp_path / "train")]) == 0
    ours = json.loads((tmp_path / "train" / "metrics.jsonl").read_text().splitlines()[0])
    assert set(rows_[0]) == set(ours)
    assert (out / "adapter" / "adapter_model.safetensors").is_file()


def test_the_shipped_recipe_and_accelerate_configs_load(tmp_path):
    """recipe/trl/paper.yaml resolves with every pinned and derived setting satisfied (on a CPU: without vLLM, on the
    tiny model); the accelerate configs parse as accelerate reads them, one process per GPU of a node."""
    from accelerate.commands.config.config_args import load_config_from_file

    cfg, args, _ = trl_spiral.resolve(["--config", str(ROOT / "recipe/trl/paper.yaml"), "--use_vllm", "false",
                                       "--use_cpu", "--model_name_or_path", "tiny", "--output_dir",
                                       str(tmp_path / "p")])
    assert (cfg.num_search, cfg.set_size, cfg.num_sets, cfg.num_aggregations, cfg.max_new_tokens) == (8, 4, 4, 4, 4096)
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps, args.num_generations) == (16, 48, 24)
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == cfg.batch_problems * 24
    kinds = {}
    for name in ("ddp", "zero3", "fsdp2"):
        config = load_config_from_file(str(ROOT / f"recipe/trl/{name}.yaml"))
        kinds[name] = config.distributed_type.value
        assert config.num_processes == 8 and config.mixed_precision == "bf16"
    assert kinds == {"ddp": "MULTI_GPU", "zero3": "DEEPSPEED", "fsdp2": "FSDP"}
