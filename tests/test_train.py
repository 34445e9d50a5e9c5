"""train.py's command line: the --help text comes from TrainConfig's field help, presets resolve as documented,
and bad input stops with one line `train.py: error: ...`, exit code 2, and nothing written to disk."""

import dataclasses
import os
import subprocess
import sys
import time

import pytest
import torch

import figures
import rollout
import train
import tiny

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tree(path):
    return sorted(os.path.relpath(os.path.join(root, name), path)
                  for root, dirs, files in os.walk(path) for name in dirs + files)


@pytest.fixture
def files(tmp_path):
    (tmp_path / "ok.jsonl").write_text('{"problem": "1 + 1", "answer": "2"}\n')
    (tmp_path / "empty.jsonl").write_text("\n")
    (tmp_path / "bad.jsonl").write_text('{"problem": "1 + 1", "answer": "2"}\n{"problem": "no answer"}\n')
    (tmp_path / "notarun").mkdir()
    (tmp_path / "notarun" / "thesis.tex").write_text("precious")
    (tmp_path / "oldrun").mkdir()
    (tmp_path / "oldrun" / "metrics.jsonl").write_text("")
    return tmp_path


BAD = {  # argv after "--preset tiny --data ok.jsonl --out new" -> a word the one-line message must contain
    "zero steps": (["--steps", "0"], "--steps must be a positive integer"),
    "negative batch": (["--batch-problems", "-1"], "--batch-problems must be a positive integer"),
    "K > C(N1, n)": (["--num-search", "4", "--set-size", "3", "--num-sets", "5"], "C(4, 3) = 4"),
    "n > N1": (["--num-search", "2", "--set-size", "3"], "larger than --num-search"),
    "zero lr": (["--lr", "0"], "--lr must be positive"),
    "not a number": (["--steps", "many"], "expects int"),
    "unknown flag": (["--num-epochs", "3"], "unrecognized arguments"),
    "unknown model": (["--model", "gpt-17"], "unknown model"),
    "missing model dir": (["--model", "./no/such/model"], "no such directory"),
    "missing data": (["--data", "{tmp}/missing.jsonl"], "--data"),
    "empty data": (["--data", "{tmp}/empty.jsonl"], "no problems"),
    "malformed data": (["--data", "{tmp}/bad.jsonl"], "line 2"),
    "existing out": (["--out", "{tmp}/oldrun"], "--resume to continue it or --overwrite"),
    "overwrite a non-run dir": (["--out", "{tmp}/notarun", "--overwrite"], "does not look like a run directory"),
    "resume without checkpoint": (["--out", "{tmp}/oldrun", "--resume"], "no checkpoint"),
    "resume and overwrite": (["--out", "{tmp}/oldrun", "--resume", "--overwrite"], "exclude each other"),
    "grpo with aggregator": (["--algo", "grpo", "--separate-aggregator"], "needs --algo spiral"),
    "grpo with own": (["--algo", "grpo", "--search-advantage", "own"], "--search-advantage own needs --algo spiral"),
    "own with 1/M": (["--search-advantage", "own", "--unbiased-set-rl"], "--search-advantage own has none"),
    "unknown search advantage": (["--search-advantage", "mine"], "invalid choice"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_exit_2_and_touches_nothing(case, files, capsys):
    extra, message = BAD[case]
    argv = ["--preset", "tiny", "--data", f"{files}/ok.jsonl", "--out", f"{files}/new"]
    argv += [a.replace("{tmp}", str(files)) for a in extra]
    before = _tree(files)
    assert train.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("train.py: error: ") and message in err, err
    assert _tree(files) == before


def test_cli_error_in_a_subprocess(files):
    """The real command line: exit code 2, one line on stderr, no traceback, nothing on disk."""
    before = _tree(files)
    result = subprocess.run([sys.executable, "train.py", "--preset", "tiny", "--data", f"{files}/ok.jsonl", "--out",
                             f"{files}/new", "--num-sets", "7", "--num-search", "4", "--set-size", "3"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["train.py: error: --num-sets 7 exceeds the C(4, 3) = 4 possible sets"]
    assert _tree(files) == before


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_paper_preset_without_a_gpu_stops_quickly_pointing_to_tiny(tmp_path):
    start = time.monotonic()
    result = subprocess.run([sys.executable, os.path.join(REPO, "train.py")], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert "no CUDA GPU" in result.stderr and "--preset tiny" in result.stderr
    assert time.monotonic() - start < 60  # seconds of imports on a busy 2-core machine, not a model download
    assert os.listdir(tmp_path) == []


def test_help_is_the_config_fields_help():
    text = "".join(train.build_parser().format_help().split())  # argparse re-wraps lines, also at hyphens
    docs = {f.name: f.metadata.get("help") for f in dataclasses.fields(train.TrainConfig)}
    assert all(docs.values())  # every field documented
    for name, doc in docs.items():
        assert "--" + name.replace("_", "-") in text and "".join(doc.split()) in text
    for flag, doc in [("--num-search", "N1: search traces per problem"), ("--set-size", "n: search traces per set"),
                      ("--num-sets", "K: sets drawn per problem"), ("--num-aggregations", "N2: aggregation traces")]:
        assert doc in docs[flag[2:].replace("-", "_")]


def test_presets_and_explicit_flags():
    paper = train.resolve_config({})
    assert (paper.model, paper.num_search, paper.set_size, paper.num_sets, paper.num_aggregations) == \
        ("Qwen/Qwen3-4B-Instruct-2507", 8, 4, 4, 4)
    assert (paper.max_new_tokens, paper.lr, paper.lora_rank, paper.max_prompt_tokens) == (4096, 2e-5, 32, 1024)
    assert train.token_budget_per_problem(paper) == 98_304
    grpo = train.resolve_config({"algo": "grpo"})
    assert (grpo.group_size, grpo.max_new_tokens) == (12, 8192)
    assert train.token_budget_per_problem(grpo) == 98_304  # the paper's equal budget
    demo = train.resolve_config({"preset": "tiny", "num_search": 6})
    assert demo.model == tiny.WARM_START_DIR and demo.data == "tiny_sums"  # the demo: warm start + sums task
    assert demo.num_search == 6 and demo.out == os.path.join("runs", "tiny-spiral")
    tiny_grpo = train.resolve_config({"preset": "tiny", "algo": "grpo"})
    assert train.token_budget_per_problem(tiny_grpo) == train.token_budget_per_problem(train.resolve_config(
        {"preset": "tiny"}))  # the tiny preset keeps the equal budget too
    assert train.resolve_config({"preset": "tiny", "max_new_tokens": 5}).max_new_tokens == 5
    parsed = vars(train.build_parser().parse_args(["--preset", "tiny", "--target-length", "none", "--no-plot"]))
    assert parsed == {"preset": "tiny", "target_length": None, "plot": False}  # only explicit flags


def test_resume_refuses_changed_settings():
    saved = dataclasses.asdict(train.resolve_config({"preset": "tiny"}))
    assert train.resolve_config({"resume": True, "steps": 50}, saved).steps == 50  # --steps may grow
    with pytest.raises(train.ConfigError, match="--lr"):
        train.resolve_config({"resume": True, "lr": 1.0}, saved)
    with pytest.raises(train.ConfigError, match="--search-advantage own differs from the checkpoint's set"):
        train.resolve_config({"resume": True, "search_advantage": "own"}, saved)
    assert saved["search_advantage"] == "set"  # config.json records the arm
    older = {k: v for k, v in saved.items() if k != "search_advantage"}  # a run from before the switch: SPIRAL
    assert train.resolve_config({"resume": True}, older).search_advantage == "set"


@pytest.mark.parametrize("preset", list(train.PRESETS))
def test_spiral_and_grpo_have_the_same_maximum_budget_in_every_preset(preset):
    """SPIRAL's (N1 + K N2) L and GRPO's G L, each computed from the preset's own settings, are equal; the written-out
    budget says the same."""
    spiral_cfg = train.resolve_config({"preset": preset})
    grpo_cfg = train.resolve_config({"preset": preset, "algo": "grpo"})
    spiral_budget = (spiral_cfg.num_search + spiral_cfg.num_sets * spiral_cfg.num_aggregations) \
        * spiral_cfg.max_new_tokens
    assert train.token_budget_per_problem(spiral_cfg) == spiral_budget == grpo_cfg.group_size * grpo_cfg.max_new_tokens
    assert train.token_budget_per_problem(grpo_cfg) == spiral_budget
    assert train.budget_line(spiral_cfg).endswith(f"= {spiral_budget:,}") and train.budget_line(spiral_cfg).startswith(
        f"({spiral_cfg.num_search} + {spiral_cfg.num_sets} x {spiral_cfg.num_aggregations}) x ")
    assert train.budget_line(grpo_cfg) == f"{grpo_cfg.group_size} x {grpo_cfg.max_new_tokens} = {spiral_budget:,}"


def test_generated_tokens_line_reports_means_by_level():
    cfg = train.resolve_config({"preset": "tiny_parts"})
    rows = [{"step": 1, "tokens_per_problem": 300.0, "tokens_per_problem_search": 100.0,
             "tokens_per_problem_aggregation": 200.0},
            {"step": 2, "tokens_per_problem": 340.0, "tokens_per_problem_search": 110.0,
             "tokens_per_problem_aggregation": 230.0}]
    assert figures.generated_tokens_line(rows, True, train.budget_line(cfg)) == (
        "tokens generated per drawn problem, mean over steps 1-2: 320 (search 105, aggregation 215), of at most "
        "(8 + 4 x 4) x 16 = 384")
    grpo = train.resolve_config({"preset": "tiny_parts", "algo": "grpo"})
    assert figures.generated_tokens_line([{"step": 3, "tokens_per_problem": 168.0}], False,
                                         train.budget_line(grpo)).endswith(
        "steps 3-3: 168, of at most 12 x 32 = 384")


def test_overwrite_accepts_a_run_directory(files):
    cfg = train.resolve_config({"preset": "tiny", "data": f"{files}/ok.jsonl", "out": f"{files}/oldrun",
                                "overwrite": True, "batch_problems": 1})  # ok.jsonl holds one problem
    assert [p.answer for p in train.validate(cfg)] == ["2"]
    assert os.path.exists(files / "oldrun" / "metrics.jsonl")  # validation itself deletes nothing


def test_collect_passes_the_search_advantage_and_the_unbiased_scale_to_spiral(monkeypatch):
    """train.collect hands --search-advantage to spiral.collect_spiral, and 1/M only with --unbiased-set-rl."""
    seen = []
    monkeypatch.setattr(train.spiral, "collect_spiral", lambda *a, **kw: seen.append(kw))
    for flags in ({}, {"search_advantage": "own"}, {"unbiased_set_rl": True}):
        train.collect(train.resolve_config({"preset": "tiny", **flags}), None, None, None, None)
    assert [kw["search_advantage"] for kw in seen] == ["set", "own", "set"]
    assert [kw["search_advantage_scale"] for kw in seen][:2] == [1.0, 1.0]
    assert seen[2]["search_advantage_scale"] == pytest.approx(1 / train.setsample.gradient_scale(8, 4, 4))


def test_num_sets_all_aggregator_and_their_budgets(monkeypatch):
    """--num-sets all parses to "all" (K = C(N1, n) wherever K is a number: the budget, M); a misspelling is one
    line; --aggregator oracle generates only the N1 search traces, so its maximum budget is N1 L; and train.collect
    hands both switches to spiral.collect_spiral."""
    parsed = vars(train.build_parser().parse_args(["--num-sets", "all", "--aggregator", "oracle"]))
    assert parsed == {"num_sets": "all", "aggregator": "oracle"}
    with pytest.raises(train.ConfigError, match="--num-sets expects an integer or all, got 'every'"):
        train.build_parser().parse_args(["--num-sets", "every"])
    every = train.resolve_config({"preset": "tiny_parts6", "num_sets": "all"})
    assert train.sets_per_problem(every) == 70 and train.gradient_scale_M(every) == pytest.approx(1.0)
    assert train.token_budget_per_problem(every) == (8 + 70 * 4) * 28
    assert train.budget_line(every) == "(8 + 70 x 4) x 28 = 8,064"
    oracle = train.resolve_config({"preset": "tiny_parts6", "aggregator": "oracle", "num_sets": "all"})
    assert train.token_budget_per_problem(oracle) == 8 * 28 and train.budget_line(oracle) == "8 x 28 = 224"
    seen = []
    monkeypatch.setattr(train.spiral, "collect_spiral", lambda *a, **kw: seen.append(kw))
    train.collect(oracle, None, None, None, None)
    assert (seen[0]["aggregator"], seen[0]["num_sets"]) == ("oracle", "all")
