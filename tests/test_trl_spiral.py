"""trl_spiral.py on the real TRL (skipped without trl; CI's engines environment has it): its advantages are
spiral_advantages, one step's LoRA gradient is train.py's on the same rollouts, metrics.jsonl has train.py's columns,
the update settings are train.py's, a short run learns, and bad flags are one-line errors.

The scripted sampler of test_spiral.py makes every reward known in advance for the advantage tests; the gradient test
samples the tiny model for real and grades with a pseudo-random reward (so that advantages are not all zero)."""

import json
import logging
import warnings
import zlib

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

SMALL = ["--preset", "tiny", "--batch-problems", "2", "--num-search", "3", "--set-size", "2", "--num-sets", "2",
         "--num-aggregations", "2", "--max-new-tokens", "6"]
G = 3 + 2 * 2  # rows per problem


def build(tmp_path, *flags, problems=None):
    cfg, eng, all_problems = trl_spiral.resolve(SMALL + ["--out", str(tmp_path / "run"), *flags])
    model, tokenizer = rollout.load_policy(cfg.model, device="cpu", dtype=cfg.dtype)
    return trl_spiral.build_trainer(cfg, eng, model, tokenizer, problems or all_problems)


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
    search_N1, aggregation_K_N2 = spiral_advantages(sets_K_n, rewards_K_N2, N1)
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


def test_without_redraws_dropped_problems_leave_zero_rows_and_count_in_no_C(trainer, scripted):
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


def lora_grads(model):
    return [p.grad.detach().clone() for p in model.parameters() if p.requires_grad]


def test_one_step_lora_gradient_is_train_py_s_on_the_same_rollouts(trainer, monkeypatch):
    monkeypatch.setattr(spiral, "reward", lambda text, gold: float(zlib.crc32(text.encode()) % 2))
    torch.manual_seed(0)
    # Prompts of different lengths, so that left padding, masks and positions matter.
    output = trainer._generate_and_score_completions(rows(Problem("What is 3 + 4?", "7"),
                                                          Problem("Now, what is 15 + 2 + 1 + 7?", "25")))
    assert output["prompt_mask"].sum(1).unique().numel() > 2
    samples = trainer.last_rollouts.samples
    assert any(s.advantage != 0 for s in samples)
    model = trainer.model
    model.train()
    model.zero_grad(set_to_none=True)
    trainer._compute_loss(model, output).backward()  # what TRL's training_step differentiates
    ours = lora_grads(model)
    model.zero_grad(set_to_none=True)
    C = train.loss_normalizer(trainer.spiral, trainer.last_rollouts.metrics["problems_kept"])
    train.accumulate_gradients(model, samples, loss_normalizer=C, temperature=trainer.spiral.temperature)
    reference = lora_grads(model)
    model.zero_grad(set_to_none=True)
    assert len(ours) == len(reference) == 2 * 7 * model.base_model.model.config.num_hidden_layers
    flat_ours, flat_ref = torch.cat([g.flatten() for g in ours]), torch.cat([g.flatten() for g in reference])
    assert flat_ref.norm() > 0
    # The two forwards (TRL's fused head, logprobs.py's chunked head) agree to float32 rounding, not bit for bit.
    assert (flat_ours - flat_ref).norm() <= 1e-5 * flat_ref.norm()


def test_settings_that_change_the_update_are_train_py_s(trainer, tmp_path):
    args, cfg = trainer.args, trainer.spiral
    assert (args.learning_rate, args.lr_scheduler_type.value, args.warmup_steps) == (cfg.lr, "constant", 0)
    assert (args.adam_beta1, args.adam_beta2, args.adam_epsilon) == (0.9, 0.95, 1e-8)
    assert (args.weight_decay, args.max_grad_norm, args.beta, args.num_iterations) == (0.0, 1.0, 0.0, 1)
    assert args.steps_per_generation == args.gradient_accumulation_steps  # one optimizer step per batch
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == cfg.batch_problems * G
    assert (args.bf16, args.gradient_checkpointing) == (False, False)  # tiny: float32, no checkpointing
    assert (args.top_k, args.top_p, args.temperature, args.max_completion_length) == (0, 1.0, 1.0, 6)
    lora = trainer.model.peft_config["default"]
    assert (lora.r, lora.lora_alpha, lora.lora_dropout) == (32, 32.0, 0.0)
    assert set(lora.target_modules) == set(train.TARGET_MODULES)
    paper, _, _ = trl_spiral.resolve(["--out", str(tmp_path / "p"), "--device", "cpu", "--model", "tiny"])
    assert paper.lr == 2e-5 and paper.gradient_checkpointing  # the paper's rate; checkpointing as train.py's


@pytest.mark.slow
def test_a_short_run_learns_and_logs_train_py_s_columns(tmp_path, one_thread, caplog, monkeypatch):
    """Two problems, so that ten steps of 2 x 16 aggregation traces show learning (0.22 -> 0.97 when measured)."""
    data = tmp_path / "two.jsonl"
    data.write_text('{"problem": "What is 3 + 4?", "answer": "7"}\n{"problem": "What is 6 + 8?", "answer": "14"}\n')
    out = tmp_path / "trl"
    caplog.set_level(logging.WARNING)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # what a user sees: each warning once per place that raises it
        assert trl_spiral.main(["--preset", "tiny", "--steps", "10", "--batch-problems", "2", "--data", str(data),
                                "--out", str(out)]) == 0
    rows_ = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows_] == list(range(1, 11))
    first, last = (np.mean([r["aggregation_accuracy"] for r in part]) for part in (rows_[:3], rows_[-3:]))
    assert last >= first + 0.3, (first, last)
    # No warning repeats step after step (TRL's GRPO scoring logs one for every step with reward-less search rows).
    messages = [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records]
    assert not [m for m in set(messages) if messages.count(m) >= 5]
    # The same columns as train.py's metrics.jsonl on the same settings (a pseudo-random reward, so that it trains).
    monkeypatch.setattr(spiral, "reward", lambda text, gold: float(zlib.crc32(text.encode()) % 2))
    assert train.main(SMALL + ["--steps", "1", "--no-plot", "--out", str(tmp_path / "train")]) == 0
    ours = json.loads((tmp_path / "train" / "metrics.jsonl").read_text().splitlines()[0])
    assert set(rows_[0]) == set(ours)
    assert (out / "adapter" / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize("argv, message", [
    (["--gradient-accumulation-steps", "5"], "--gradient-accumulation-steps must be a divisor of the 14 rows"),
    (["--algo", "grpo"], "unrecognized arguments: --algo grpo"),
    (["--use-vllm"], "--use-vllm needs a CUDA GPU and vllm"),
    (["--num-sets", "9"], "--num-sets 9 exceeds the C(3, 2) = 3 possible sets"),
])
def test_bad_flags_are_one_line_errors_and_write_nothing(argv, message, tmp_path, capsys):
    out = tmp_path / "run"
    assert trl_spiral.main(SMALL + ["--out", str(out)] + argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("trl_spiral.py: error: ") and message in err and err.count("\n") == 1
    assert not out.exists()
