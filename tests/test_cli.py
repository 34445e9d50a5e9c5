"""cli.py's bounds at their edges: each check refuses the first bad value and accepts the last good one, so
an off-by-one (`<` for `<=`), a check over the wrong element of a list or a term dropped from a sum fails here.
Validation only: no model is loaded, nothing is trained.

The one-line, exit-2, touches-nothing contract of these errors is tests/test_train.py's and test_reliability.py's."""

import dataclasses
import json
import os

import pytest

import checkpoint
import cli
import evaluate
import tiny
import train
from problemset import Problem

PROBLEMS = 5


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps({"problem": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(PROBLEMS)))
    return str(path)


def _validate(data, tmp_path, **flags):
    """cli.validate on the tiny preset with `flags` (TrainConfig field names): the problems, or ConfigError."""
    explicit = {"preset": "tiny", "model": "tiny", "data": data, "out": str(tmp_path / "new"), "batch_problems": 1,
                **flags}
    return cli.validate(train.resolve_config(explicit))


# (flags accepted, flags refused one step past them, the message): each pair straddles one bound
TRAIN_EDGES = {
    "save every": ({"save_every": 1}, {"save_every": 0}, "--save-every must be a positive integer"),
    "lr x weight decay": ({"lr": 0.5, "weight_decay": 1.999}, {"lr": 0.5, "weight_decay": 2.0},
                          "--weight-decay must be below 1 / --lr"),
    "cpu threads": ({"cpu_threads": os.cpu_count()}, {"cpu_threads": os.cpu_count() + 1},
                    f"--cpu-threads must be at most {os.cpu_count()}"),
    "seed": ({"seed": 2**64 - 1}, {"seed": 2**64}, "--seed must be in [0, 2**64)"),
    "temperature": ({"temperature": cli.MIN_TEMPERATURE}, {"temperature": cli.MIN_TEMPERATURE * 0.999},
                    "--temperature must be at least 0.001"),
    "adam beta1": ({"adam_beta1": 0.999}, {"adam_beta1": 1.0}, "--adam-beta1 must be in [0, 1)"),
    "adam beta2": ({"adam_beta2": 0.0}, {"adam_beta2": 1.0}, "--adam-beta2 must be in [0, 1)"),
    # N1 + K N2 = 4 + 6 x 682 = 4096 traces: the cap counts the aggregation traces too
    "traces per problem": ({"num_search": 4, "set_size": 2, "num_sets": 6, "num_aggregations": 682},
                           {"num_search": 4, "set_size": 2, "num_sets": 6, "num_aggregations": 683},
                           "at most 4096 traces"),
    "grpo group": ({"algo": "grpo", "group_size": 4096}, {"algo": "grpo", "group_size": 4097}, "at most 4096 traces"),
    "set size": ({"num_search": 3, "set_size": 3, "num_sets": 1}, {"num_search": 3, "set_size": 4, "num_sets": 1},
                 "--set-size 4 is larger than --num-search 3"),
    "every possible set": ({"num_search": 4, "set_size": 2, "num_sets": 6},
                           {"num_search": 4, "set_size": 2, "num_sets": 7}, "C(4, 2) = 6"),
    "unbiased set RL": ({"unbiased_set_rl": True, "num_sets": 2}, {"unbiased_set_rl": True, "num_sets": 1},
                        "M = 0"),
    "set RL's 1/M": ({"unbiased_set_rl": True, "search_advantage": "set"},
                     {"unbiased_set_rl": True, "search_advantage": "own"}, "--search-advantage own has none"),
    "own needs spiral": ({"search_advantage": "own"}, {"search_advantage": "own", "algo": "grpo"},
                         "--search-advantage own needs --algo spiral"),
    "a resumed config's search advantage": ({"search_advantage": "none"}, {"search_advantage": "Own"},
                                            "--search-advantage Own: expected set, own or none"),
    "none needs spiral": ({"search_advantage": "none"}, {"search_advantage": "none", "algo": "grpo"},
                          "--search-advantage none needs --algo spiral"),
    "a resumed config's aggregator": ({"aggregator": "oracle"}, {"aggregator": "Oracle"},
                                      "--aggregator Oracle: expected model or oracle"),
    "the oracle trains line 13 alone": ({"aggregator": "oracle", "search_advantage": "set"},
                                        {"aggregator": "oracle", "search_advantage": "own"},
                                        "--aggregator oracle trains the search traces by line 13 alone"),
    "the oracle writes no aggregation trace": ({"aggregator": "oracle"},
                                               {"aggregator": "oracle", "separate_aggregator": True},
                                               "--separate-aggregator with --aggregator oracle"),
    "the oracle needs spiral": ({"aggregator": "oracle"}, {"aggregator": "oracle", "algo": "grpo"},
                                "--aggregator oracle needs --algo spiral"),
    "every set needs spiral": ({"num_sets": "all"}, {"num_sets": "all", "algo": "grpo"},
                               "--num-sets all needs --algo spiral"),
    # C(9, 4) = 126 model-aggregated sets are allowed, C(10, 4) = 210 too, C(10, 5) = 252, C(11, 5) = 462 not
    "every set with a model aggregator": ({"num_sets": "all", "num_search": 10, "set_size": 5},
                                          {"num_sets": "all", "num_search": 11, "set_size": 5},
                                          "C(11, 5) = 462 aggregation prompts per problem, more than 256"),
    "every set with the oracle": ({"num_sets": "all", "num_search": 16, "set_size": 8, "aggregator": "oracle"},
                                  {"num_sets": "all", "num_search": 16, "set_size": 17, "aggregator": "oracle"},
                                  "--set-size 17 is larger than --num-search 16"),
    "batch problems": ({"batch_problems": PROBLEMS}, {"batch_problems": PROBLEMS + 1},
                       f"at most the {PROBLEMS} problems"),
    "max draws": ({"max_draws": 100 * PROBLEMS}, {"max_draws": 100 * PROBLEMS + 1},
                  f"--max-draws must be at most {100 * PROBLEMS}"),
    "max new tokens": ({"max_new_tokens": cli.MAX_NEW_TOKENS}, {"max_new_tokens": cli.MAX_NEW_TOKENS + 1},
                       "--max-new-tokens must be at most 262,144"),
    "lora rank": ({"lora_rank": 4096}, {"lora_rank": 4097}, "--lora-rank must be at most 4,096"),
    "steps": ({"steps": cli.MAX_COUNT}, {"steps": cli.MAX_COUNT + 1}, "--steps must be at most"),
    "lr": ({"lr": 1.0}, {"lr": 1.0001}, "--lr must be at most 1"),
}


@pytest.mark.parametrize("case", list(TRAIN_EDGES))
def test_train_bounds_accept_the_last_good_value_and_refuse_the_first_bad_one(case, data, tmp_path):
    good, bad, message = TRAIN_EDGES[case]
    assert len(_validate(data, tmp_path, **good)) == PROBLEMS
    with pytest.raises(cli.ConfigError) as error:
        _validate(data, tmp_path, **bad)
    assert message in str(error.value) and "\n" not in str(error.value)
    assert os.listdir(tmp_path) == ["problems.jsonl"]  # validation writes nothing


def test_none_is_a_value_only_for_optional_flags():
    parser = train.build_parser()
    assert vars(parser.parse_args(["--max-draws", "none"])) == {"max_draws": None}
    with pytest.raises(cli.ConfigError, match="--steps expects int, got 'none'"):
        parser.parse_args(["--steps", "none"])
    with pytest.raises(cli.ConfigError, match="--lr expects float, got 'None'"):
        parser.parse_args(["--lr", "None"])


def _fake_run(out, step):
    """OUT/checkpoint/step-N/trainer_state.json and `latest`: what _check_resume_step reads."""
    path = out / "checkpoint" / f"step-{step:06d}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"step": step, "data": {"epoch": 0, "index": 1},
                                                         "config": {}}))
    (out / "checkpoint" / "latest").write_text(f"step-{step:06d}\n")


def test_resume_to_fewer_steps_than_the_checkpoint_is_refused_at_any_distance(tmp_path):
    _fake_run(tmp_path / "run", 3)
    cfg = dataclasses.replace(train.resolve_config({"preset": "tiny"}), out=str(tmp_path / "run"))
    for steps in (3, 4):
        cli._check_resume_step(dataclasses.replace(cfg, steps=steps))
    for steps in (1, 2):
        with pytest.raises(cli.ConfigError, match=f"--steps {steps}: the run in .* is already at step 3"):
            cli._check_resume_step(dataclasses.replace(cfg, steps=steps))


# ----------------------------------------------------------------------------------------------------------------------
# evaluate.py's flags (cli.validate_evaluation)


def _evaluate_args(tmp_path, *flags):
    return evaluate.parse_args(["--preset", "tiny", "--out", str(tmp_path / "r.json"), *flags])


EVALUATE_EDGES = {  # (flags accepted, flags refused, message)
    "every RSA population checked": (["--rsa-populations", "4,8", "--rsa-set-size", "4"],
                                     ["--rsa-populations", "2,8", "--rsa-set-size", "4"],
                                     "RSA population P=2 is smaller than the set size k=4"),
    "every k checked": (["--k-list", "1,8", "--num-samples", "8"], ["--k-list", "1,9", "--num-samples", "8"],
                        "k=9 in --k-list is larger than the 8 samples"),
    "every budget bounded": (["--max-tokens-list", f"4,{cli.MAX_NEW_TOKENS}"],
                             ["--max-tokens-list", f"4,{cli.MAX_NEW_TOKENS + 1}"],
                             "--max-tokens-list must be at most 262,144"),
    "no k below 1": (["--k-list", "1,2"], ["--k-list", "0,2"], "--k-list values must be positive"),
    "samples": (["--num-samples", "4096", "--k-list", "1"], ["--num-samples", "4097", "--k-list", "1"],
                "--num-samples must be at most 4,096"),
}


@pytest.mark.parametrize("case", list(EVALUATE_EDGES))
def test_evaluate_bounds_check_every_value_of_a_list(case, tmp_path):
    good, bad, message = EVALUATE_EDGES[case]
    _evaluate_args(tmp_path, *good)
    with pytest.raises(cli.ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _evaluate_args(tmp_path, *bad)


def test_the_default_k_list_is_the_powers_of_two_and_the_number_of_samples(tmp_path):
    assert _evaluate_args(tmp_path, "--num-samples", "6").k_list == [1, 2, 4, 6]
    assert _evaluate_args(tmp_path, "--num-samples", "8").k_list == [1, 2, 4, 8]


def test_evaluate_refuses_a_label_used_twice_and_a_png_it_did_not_write(tmp_path):
    with pytest.raises(cli.ConfigError, match="the label 'a' is used twice"):
        _evaluate_args(tmp_path, "--policy", "a=tiny", "--policy", "a=tiny")
    (tmp_path / "r.png").write_bytes(b"a user's figure")
    with pytest.raises(cli.ConfigError, match="r.png exists and was not written with r.json"):
        _evaluate_args(tmp_path)
    assert (tmp_path / "r.png").read_bytes() == b"a user's figure"


def test_a_prompt_exactly_max_prompt_tokens_long_is_kept(capsys):
    tokenizer = tiny.build_tiny_tokenizer()
    problems = [Problem("1 + 1", "2"), Problem("12345 + 67890 + 11111", "91346")]
    lengths = [len(cli.rollout.chat_prompt_ids(tokenizer, cli.rollout.search_prompt(p.problem))) for p in problems]
    assert lengths[0] < lengths[1]
    policies = [{"tokenizer": tokenizer}]
    assert cli.short_enough(problems, policies, lengths[1]) == problems
    assert capsys.readouterr().err == ""
    assert cli.short_enough(problems, policies, lengths[1] - 1) == problems[:1]
    assert "dropped 1 of 2 problems longer than" in capsys.readouterr().err
    with pytest.raises(cli.ConfigError, match="every problem's prompt is longer"):
        cli.short_enough(problems, policies, lengths[0] - 1)


class _CharTokenizer:
    """A stand-in tokenizer: one token per character of the user message, times `per_char`."""

    def __init__(self, per_char):
        self.per_char = per_char

    def apply_chat_template(self, messages, **kwargs):
        return {"input_ids": [0] * (len(messages[0]["content"]) * self.per_char)}


def test_a_problem_must_fit_every_policy_s_tokenizer():
    """Bug: a problem kept when it fits one policy's tokenizer but not another's (`any` for `all`)."""
    problems = [Problem("1 + 1", "2"), Problem("1 + 1 + 1 + 1", "4")]
    fine, coarse = _CharTokenizer(1), _CharTokenizer(2)
    limit = len(cli.rollout.search_prompt(problems[1].problem))  # the longer prompt fits `fine` exactly
    assert cli.short_enough(problems, [{"tokenizer": fine}], limit) == problems
    kept = cli.short_enough(problems, [{"tokenizer": fine}, {"tokenizer": coarse}], 2 * limit - 8)
    assert kept == problems[:1]


def test_warm_start_only_refuses_a_directory_that_is_not_a_warm_start(tmp_path, monkeypatch):
    monkeypatch.setattr(tiny, "rebuild_warm_start", lambda *a, **k: pytest.fail("replaced a user's directory"))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("precious")
    with pytest.raises(cli.ConfigError, match="exists and is not a warm start"):
        cli.warm_start_only({"preset": "tiny", "warm_start_only": True, "out": str(tmp_path / "mine")}, 1)
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "precious"
    assert checkpoint.out_path_problem(str(tmp_path / "mine")) is None  # refused for what it holds, not as a path
