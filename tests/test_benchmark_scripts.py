"""The benchmark scripts (benchmarks/reproduce.py, second_task.py and their runner.py) keep what a user made:
--help and typos run nothing; a run directory is reused only when it holds exactly the run asked for;
outputs are checked before any work; the README and the shipped results are rewritten only when named; trainings
run a few at a time and a failure stops the rest."""

import json
import os
import shutil
import zlib

import pytest

from tests.test_user_files import _load, _one_line, _snapshot, nothing_runs  # noqa: F401 (a fixture)
import checkpoint
import figures
import spiral
import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
reproduce, second_task, runner = _load("reproduce"), _load("second_task"), _load("runner")

# ----------------------------------------------------------------------------------------------------------------------
# --help and typos: parsed before anything runs


@pytest.mark.parametrize("script", ["reproduce", "second_task"])
def test_help_and_typos_run_nothing(script, nothing_runs, capsys):
    module = {"reproduce": reproduce, "second_task": second_task}[script]
    before = _snapshot(os.path.join(ROOT, "README.md"), os.path.join(ROOT, "benchmarks"))
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--help"])
    assert exit_info.value.code == 0 and "usage:" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--sedes", "1"])  # a typo
    assert exit_info.value.code == 2
    _one_line(capsys, f"{script}.py", "unrecognized arguments: --sedes")
    assert _snapshot(os.path.join(ROOT, "README.md"), os.path.join(ROOT, "benchmarks")) == before


# ----------------------------------------------------------------------------------------------------------------------
# Benchmark scripts: a run directory is reused only when it holds exactly the run asked for


def _fake_run(out, flags, steps_logged, adapter=True, code=None):
    """A run directory as train.py leaves it: config.json of `flags` with the versions and code digest that trained
    it (this checkout's unless `code`), metrics up to `steps_logged`, the adapter."""
    out.mkdir(parents=True)
    cfg = train.resolve_config(vars(train.build_parser().parse_args([*flags, "--out", str(out)])))
    import dataclasses
    versions = checkpoint.versions("cpu") | ({"code": code} if code else {})
    (out / "config.json").write_text(json.dumps({**dataclasses.asdict(cfg), "versions": versions}))
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, steps_logged + 1)))
    if adapter:
        (out / "adapter").mkdir()
        (out / "adapter" / "adapter_config.json").write_text("{}")


def test_a_run_is_reused_only_with_the_same_settings_and_all_its_steps(tmp_path):
    flags = ["--preset", "tiny_parts", "--algo", "grpo", "--seed", "0"]
    run = runner.Run("grpo-s0", str(tmp_path / "grpo-s0"), flags)
    assert runner.run_state(run) == ("new", "")
    _fake_run(tmp_path / "grpo-s0", [*flags, "--steps", "1"], 1)  # an earlier `--steps 1` trial, finished
    state, why = runner.run_state(run)
    assert state == "differs" and "steps=1" in why
    assert runner.run_state(runner.Run("x", run.out, [*flags, "--steps", "1"]))[0] == "finished"
    assert runner.run_state(runner.Run("x", run.out, [*flags, "--steps", "1", "--seed", "1"]))[0] == "differs"
    shutil.rmtree(run.out)
    _fake_run(tmp_path / "grpo-s0", [*flags, "--steps", "3"], 2, adapter=False)  # part-trained, other settings:
    assert runner.plan([run], True, "test") == ([(run, ["--overwrite"])], [])  # --overwrite replaces it, never
    with pytest.raises(SystemExit):  # resumes it; without --overwrite the plan stops
        runner.plan([run], False, "test")
    shutil.rmtree(run.out)
    _fake_run(tmp_path / "grpo-s0", flags, 29)  # stopped at step 29 of 30 with no checkpoint: train.py --resume
    assert runner.run_state(run) == ("resume", "")  # restarts it from step 0 (nothing was saved to continue from)
    (tmp_path / "grpo-s0" / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 31)))
    assert runner.run_state(run) == ("finished", "")
    shutil.rmtree(tmp_path / "grpo-s0" / "adapter")  # every step logged, stopped before it saved its adapter
    assert runner.run_state(run) == ("resume", "")


def test_a_run_stopped_before_its_first_checkpoint_is_continued_by_the_same_command(tmp_path, monkeypatch, capsys):
    """Ctrl-C in a run's first checkpoint interval leaves config.json and some metrics, no checkpoint. The scripts'
    advice is to rerun the same command: the runner resumes that run (train.py --resume starts it again from step 0),
    with or without --overwrite, instead of refusing it; the rerun then finishes it."""
    monkeypatch.setattr(spiral, "reward", lambda text, gold: float(zlib.crc32(text.encode()) % 2))  # test_checkpoint's
    data = tmp_path / "problems.jsonl"
    data.write_text("".join(json.dumps({"problem": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(3)))
    flags = ["--preset", "tiny", "--model", "tiny", "--data", str(data), "--batch-problems", "1", "--num-search", "2",
             "--set-size", "2", "--num-sets", "1", "--num-aggregations", "2", "--max-new-tokens", "4", "--no-plot",
             "--steps", "3", "--save-every", "3"]
    run = runner.Run("s0", str(tmp_path / "s0"), flags)
    real_append = checkpoint.append_metrics

    def ctrl_c_at_step_2(path, row):
        if row["step"] == 2:
            raise KeyboardInterrupt
        real_append(path, row)

    with monkeypatch.context() as interrupted:
        interrupted.setattr(checkpoint, "append_metrics", ctrl_c_at_step_2)
        assert train.main([*flags, "--out", run.out]) == 130
    assert "continue with --resume" in capsys.readouterr().err
    assert checkpoint.latest_checkpoint(run.out) is None and runner._steps_logged(run) == 1
    assert runner.run_state(run) == ("resume", "")
    for overwrite in (False, True):
        assert runner.plan([run], overwrite, "test") == ([(run, ["--resume"])], [])
    assert train.main([*flags, "--out", run.out, "--resume"]) == 0
    assert [r["step"] for r in checkpoint.read_metrics(os.path.join(run.out, "metrics.jsonl"))] == [1, 2, 3]
    assert runner.run_state(run) == ("finished", "")
    assert runner.plan([run], True, "test") == ([], [run])  # --overwrite trains again only what cannot be reused


@pytest.mark.parametrize("script", ["reproduce", "second_task"])
@pytest.mark.parametrize("seeds,message", [("0,18446744073709551616", "each seed must be in [0, 2**64)"),
                                           ("0,-1", "each seed must be in [0, 2**64)"),
                                           ("3,3", "at least 2 distinct seeds"), ("0,x", "comma-separated integers")])
def test_a_seed_train_py_refuses_stops_the_script_before_any_training(script, seeds, message, tmp_path, nothing_runs,
                                                                      capsys):
    if script == "reproduce":
        pytest.importorskip("matplotlib")
    module = {"reproduce": reproduce, "second_task": second_task}[script]
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--seeds", seeds, "--runs-dir", str(tmp_path / "runs")]
                    + (["--out", str(tmp_path / "t")] if script == "second_task" else []))
    assert exit_info.value.code == 2
    _one_line(capsys, f"{script}.py", "--seeds", message)
    assert not (tmp_path / "runs").exists()


def test_settings_train_py_refuses_stop_the_plan_before_any_training(tmp_path, nothing_runs, capsys):
    """A script's --steps reaches train.py as it is: one train.py would refuse stops the plan, naming the run."""
    run = runner.Run("grpo-s0", str(tmp_path / "grpo-s0"), ["--preset", "tiny_parts", "--steps", str(2**40)])
    with pytest.raises(SystemExit) as exit_info:
        runner.plan([runner.Run("ok", str(tmp_path / "ok"), ["--preset", "tiny_parts"]), run], False, "test")
    assert exit_info.value.code == 2
    _one_line(capsys, "test", "grpo-s0: --steps must be at most 2,147,483,647")


def test_a_runs_dir_holding_a_run_moved_aside_by_overwrite_is_still_the_script_s(tmp_path):
    """train.py --overwrite renames the old run to NAME.old-TIME until the new one checkpoints; interrupted before,
    the rerun of the same command must not take that folder for a user's."""
    (tmp_path / "grpo-s0.old-20261125-101500").mkdir()
    (tmp_path / "grpo-s0.old-20261125-101500-2").mkdir()
    assert runner.runs_dir_problem(str(tmp_path), r"(grpo|spiral)-s\d+(\.log)?|eval") is None
    (tmp_path / "grpo-s0.older").mkdir()
    assert "it holds grpo-s0.older" in runner.runs_dir_problem(str(tmp_path), r"(grpo|spiral)-s\d+(\.log)?|eval")


def test_a_run_trained_by_other_code_is_not_reused(tmp_path):
    """The shipped second-task table once came from runs an earlier commit trained, reused because their settings
    matched: a finished run is reused only when its config.json and latest checkpoint name this checkout's code."""
    flags = ["--preset", "tiny_parts", "--algo", "grpo", "--seed", "0", "--steps", "1"]
    run = runner.Run("grpo-s0", str(tmp_path / "grpo-s0"), flags)
    _fake_run(tmp_path / "grpo-s0", flags, 1, code="0123456789ab")
    state, why = runner.run_state(run)
    assert state == "differs" and "other code (0123456789ab;" in why and checkpoint.code_digest() in why
    config = json.loads((tmp_path / "grpo-s0" / "config.json").read_text())
    config["versions"]["code"] = checkpoint.code_digest()
    (tmp_path / "grpo-s0" / "config.json").write_text(json.dumps(config))
    assert runner.run_state(run) == ("finished", "")
    step = tmp_path / "grpo-s0" / "checkpoint" / "step-000001"  # resumed and saved by other code
    step.mkdir(parents=True)
    (step / "trainer_state.json").write_text(json.dumps({"step": 1, "data": {"epoch": 0, "index": 8}, "config": config,
                                                         "versions": {"code": "0123456789ab"}}))
    assert runner.run_state(run)[0] == "differs"
    del config["versions"]  # a run from before digests were recorded
    (tmp_path / "grpo-s0" / "config.json").write_text(json.dumps(config))
    shutil.rmtree(tmp_path / "grpo-s0" / "checkpoint")
    assert "not recorded" in runner.run_state(run)[1]


def test_the_cold_evaluation_runs_on_a_fresh_empty_cache_and_a_failure_stops_the_script(monkeypatch, capsys):
    """The tables come from this code's traces: evaluate.py gets a --cache-dir that is empty when it starts (not its
    default cache, which an earlier version may have filled) and gone after; a failed evaluation is exit 1."""
    calls, codes = [], [0, 3]

    def evaluate(command, cwd):
        cache = command[command.index("--cache-dir") + 1]
        calls.append((command, cache, os.listdir(cache)))
        open(os.path.join(cache, "trace.json"), "w").close()
        return runner.subprocess.CompletedProcess(command, codes[len(calls) - 1])

    monkeypatch.setattr(runner.subprocess, "run", evaluate)
    assert runner.evaluate_cold(["--preset", "tiny"], "test") >= 0
    (command, cache, listed), = calls
    assert command[1:4] == ["evaluate.py", "--preset", "tiny"] and listed == [] and not os.path.exists(cache)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        runner.evaluate_cold(["--preset", "tiny"], "test")
    assert exit_info.value.code == 1
    assert capsys.readouterr().err.endswith("test: error: the evaluation failed (its message is above)\n")
    assert not os.path.exists(calls[1][1])


def test_the_provenance_line_s_minutes_are_a_range_or_one_value():
    assert reproduce.span([2.14, 2.43, 2.2]) == "2.1-2.4" and reproduce.span([0.71, 0.74]) == "0.7"


def test_the_code_digest_names_the_project_s_python_files(tmp_path, monkeypatch):
    """Any change to a top-level .py file changes the digest; files elsewhere (tests, data) do not."""
    for name in ("checkpoint.py", "train.py", "setsample.py"):
        shutil.copy(os.path.join(ROOT, name), tmp_path / name)
    (tmp_path / "data").mkdir()
    digest = lambda: checkpoint.code_digest(str(tmp_path))  # noqa: E731
    before = digest()
    (tmp_path / "data" / "x.jsonl").write_text("{}")
    assert digest() == before
    (tmp_path / "setsample.py").write_text((tmp_path / "setsample.py").read_text() + "\n# a comment\n")
    assert digest() != before
    changed = digest()
    (tmp_path / "new_concept.py").write_text("")
    assert digest() != changed


def test_second_task_stops_before_work_on_a_reused_looking_trial(tmp_path, nothing_runs, capsys):
    runs = tmp_path / "runs"
    for algo in ("grpo", "spiral"):
        for seed in (0, 1):
            _fake_run(runs / f"{algo}-s{seed}", ["--preset", "tiny_parts", "--algo", algo, "--seed", str(seed),
                                                   "--no-plot", "--steps", "1"], 1)
    shipped, before = _snapshot(os.path.join(ROOT, "benchmarks")), _snapshot(runs)
    with pytest.raises(SystemExit) as exit_info:
        second_task.main(["--seeds", "0,1", "--runs-dir", str(runs), "--out", str(tmp_path / "t")])
    assert exit_info.value.code == 2
    _one_line(capsys, "second_task.py", "grpo-s0 exists and cannot be reused", "steps=1", "--overwrite")
    assert _snapshot(runs) == before and _snapshot(os.path.join(ROOT, "benchmarks")) == shipped
    assert not list(tmp_path.glob("t.*"))


@pytest.mark.parametrize("existing,message", [
    ("t.md", "was not written by second_task.py"),  # a user's notes named like the result
    ("t.png", "exists without"),
])
def test_second_task_never_replaces_a_file_it_did_not_write(existing, message, tmp_path, nothing_runs, capsys):
    (tmp_path / existing).write_text("mine")
    assert second_task.main(["--seeds", "0,1", "--runs-dir", str(tmp_path / "runs"),
                             "--out", str(tmp_path / "t")]) == 2
    _one_line(capsys, "second_task.py", message)
    assert (tmp_path / existing).read_text() == "mine" and not (tmp_path / "runs").exists()


def test_second_task_draws_no_point_a_short_run_did_not_have():
    """figures.smoothed, which the scripts' training curves (figures.plot_seed_mean) go through."""
    for values in ([0.5], [0.1, 0.3], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]):
        x, y = figures.smoothed(values)
        assert len(x) == len(y) <= len(values) and 1 <= min(x) and max(x) <= len(values)
        assert min(values) <= min(y) and max(y) <= max(values)
    x, y = figures.smoothed([0.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    assert list(x) == [3.0, 4.0] and list(y) == pytest.approx([0.2, 0.4])


@pytest.fixture
def checkout_copy(tmp_path, monkeypatch):
    """reproduce.py pointed at a copy of the README and benchmarks/: even a buggy reproduce.py cannot write the
    repository's own files from a test."""
    copy_root = tmp_path / "checkout"
    (copy_root / "benchmarks").mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "README.md"), copy_root / "README.md")
    for made in reproduce.KEPT_FIGURES.values():
        if os.path.exists(os.path.join(ROOT, made)):
            shutil.copy(os.path.join(ROOT, made), copy_root / made)
    monkeypatch.setattr(reproduce, "ROOT", str(copy_root))
    monkeypatch.chdir(copy_root)
    return copy_root


def test_reproduce_refuses_a_run_directory_with_other_settings_before_any_work(tmp_path, checkout_copy, nothing_runs,
                                                                               capsys):
    pytest.importorskip("matplotlib")  # reproduce.py refuses to start without it (the figures need it)
    runs = tmp_path / "runs"
    _fake_run(runs / "tiny-spiral-s0", ["--preset", "tiny", "--seed", "0", "--steps", "3"], 3)
    before, checkout = _snapshot(runs), _snapshot(checkout_copy)
    with pytest.raises(SystemExit) as exit_info:
        reproduce.main(["--seeds", "0,1", "--runs-dir", str(runs), "--update-readme"])
    assert exit_info.value.code == 2
    _one_line(capsys, "reproduce.py", "tiny-spiral-s0 exists and cannot be reused", "steps=3")
    assert _snapshot(runs) == before and _snapshot(checkout_copy) == checkout


def test_reproduce_rewrites_the_readme_only_when_told(tmp_path, checkout_copy, monkeypatch):
    pytest.importorskip("matplotlib")
    """Everything after training and evaluation, on made-up results: without --update-readme only RUNS is written."""
    runs = tmp_path / "runs"
    seeds = [0, 1]
    for algo in ("spiral", "grpo"):
        for s in seeds:
            _fake_run(runs / f"tiny-{algo}-s{s}", ["--preset", "tiny", "--seed", str(s)]
                      + (["--algo", "grpo"] if algo == "grpo" else []), 0)
            keys = {"spiral": ["search_accuracy", "aggregation_accuracy", "rollout/entropy_search"],
                    "grpo": ["accuracy", "rollout/entropy_grpo"]}[algo]
            (runs / f"tiny-{algo}-s{s}" / "metrics.jsonl").write_text("".join(
                json.dumps({"step": t, **{k: 0.02 * t + 0.1 * s for k in keys}}) + "\n" for t in range(1, 101)))
    summary = lambda x: {"passk": {"k": [1, 2, 4, 8], "pass_at_k": [x] * 4, "tokens": [1] * 4, "budget": [1, 2, 4, 8],  # noqa: E731
                                   "max_new_tokens": 12},
                         "majority": {"k": [1, 2, 4, 8], "accuracy": [x] * 4, "tokens": [1] * 4,
                                      "budget": [1, 2, 4, 8], "ties": [0] * 4, "votes": [1] * 4, "max_new_tokens": 12},
                         "rsa": [{"population": 4, "set_size": 4, "step": [1, 2, 3], "pass_at_1": [x] * 3,
                                  "tokens": [1] * 3, "budget": [1, 2, 3], "max_new_tokens": 12}]}

    def fake_evaluate(cmd, *args, **kwargs):
        out = cmd[cmd.index("--out") + 1]
        os.makedirs(os.path.dirname(out), exist_ok=True)
        policies = {"base": {"summary": summary(0.3)}}
        policies.update({f"{a}-s{s}": {"summary": summary(0.5 + 0.1 * s)} for a in ("grpo", "spiral") for s in seeds})
        open(out, "w").write(json.dumps({"policies": policies}))
        return type("Done", (), {"returncode": 0})()

    monkeypatch.setattr(runner.subprocess, "run", fake_evaluate)
    monkeypatch.setattr(runner.subprocess, "Popen", lambda *a, **k: pytest.fail("trained a finished run"))
    before = _snapshot(checkout_copy)
    assert reproduce.main(["--seeds", "0,1", "--runs-dir", str(runs)]) == 0
    assert _snapshot(checkout_copy) == before
    report = (runs / "report.md").read_text()
    assert "| pass@1 | 0.300 | 0.550 ± 0.071 [0.500, 0.600] | 0.550 ± 0.071 [0.500, 0.600] |" in report
    assert "| search accuracy | 0.16 ± 0.07 [0.11, 0.21] |" in report  # steps 1-10 of 0.02 t + 0.1 s: 0.11 + 0.1 s
    assert (runs / "seeds.png").stat().st_size > 10_000 and (runs / "eval" / "comparison.png").exists()


# ----------------------------------------------------------------------------------------------------------------------
# benchmarks/runner.py's parallel trainings, and reproduce.py's mean figure


class FakeTraining:
    """A stand-in for a train.py process: writes its metrics one step per poll, then exits with `code`."""

    def __init__(self, out, steps, code, started):
        self.out, self.steps, self.code, self.step, self.returncode = out, steps, code, 0, None
        started.append(self)

    def poll(self):
        if self.step < self.steps:
            self.step += 1
            os.makedirs(self.out, exist_ok=True)
            with open(os.path.join(self.out, "metrics.jsonl"), "a") as f:
                f.write(json.dumps({"step": self.step}) + "\n")
            return None
        self.returncode = self.code
        return self.code

    def send_signal(self, sig):
        self.returncode = self.code = 130

    def wait(self):
        return self.code


def test_trainings_run_a_few_at_a_time_and_a_failure_stops_the_rest(tmp_path, monkeypatch, capsys):
    started, codes, jobs = [], {"a": 0, "b": 0, "c": 1, "d": 0}, [1]
    monkeypatch.setattr(runner.time, "sleep", lambda s: None)

    def popen(cmd, cwd, stdout, stderr, preexec_fn):
        assert preexec_fn is runner.sigint_stops  # the SIGINT that stops a run reaches it (see the test below)
        out = cmd[cmd.index("--out") + 1]
        running = [p for p in started if p.returncode is None]
        assert len(running) < jobs[0]
        return FakeTraining(out, 6 if out.endswith("d") else 3, codes[os.path.basename(out)], started)

    monkeypatch.setattr(runner.subprocess, "Popen", popen)
    runs = [(runner.Run(name, str(tmp_path / name), ["--preset", "tiny"]), []) for name in "ab"]
    seconds = runner.train_all(runs, str(tmp_path), 1, {"a": 3, "b": 3}, "test")  # one after the other
    assert sorted(seconds) == ["a", "b"] and [p.out for p in started] == [str(tmp_path / "a"), str(tmp_path / "b")]
    started.clear()
    jobs[0] = 2
    runs = [(runner.Run(name, str(tmp_path / name), ["--preset", "tiny"]), []) for name in "cd"]
    with pytest.raises(SystemExit) as exit_info:
        runner.train_all(runs, str(tmp_path), 2, {"c": 3, "d": 6}, "test")
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert "test: error: training c failed (exit 1)" in err and f"log: {tmp_path / 'c.log'}" in err
    assert started[1].code == 130 and started[1].step < 6  # the other run was stopped as Ctrl-C stops it


def test_the_steps_logged_are_read_while_train_py_appends_a_line(tmp_path):
    """The progress display reads metrics.jsonl while train.py writes it: a half-written last line is not a step,
    and does not hide the complete ones before it."""
    run = runner.Run("a", str(tmp_path / "a"), [])
    assert runner._steps_logged(run) == 0  # not started
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "search_acc')
    assert runner._steps_logged(run) == 2
    (tmp_path / "a" / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"step": 3}')  # newline not yet
    assert runner._steps_logged(run) == 2


def test_progress_counts_the_steps_left_a_resumed_run_from_its_checkpoint_an_overwritten_one_from_zero(
        tmp_path, monkeypatch):
    """With --overwrite the old run's 3 logged steps are not done work (the bar read 0/0 steps for a whole
    second_task.py --overwrite); with --resume the steps up to its checkpoint are, those logged after it are not (it
    redoes them), and a run resumed with no checkpoint redoes every step."""
    monkeypatch.setattr(runner.time, "sleep", lambda s: None)
    shown = []

    class Recorder:
        def __init__(self, total, desc, unit):
            shown.append([total, 0])

        def update(self, n):
            shown[-1][1] += n

        def close(self):
            pass

    class Rewriting(FakeTraining):
        """train.py: its old metrics.jsonl is still there at the first polls (loading the model), then it keeps the
        steps up to `start` (0 for --overwrite) and goes on from there."""

        def __init__(self, out, old_steps, start):
            super().__init__(out, 3, 0, [])
            self.step, self.start, self.polls, self.new = old_steps, start, 0, False

        def poll(self):
            assert shown[-1][1] <= (self.step - self.start if self.new else 0)  # never steps it has not done
            self.polls += 1
            if self.polls == 3:  # the run writes its first step: the old file goes
                metrics = os.path.join(self.out, "metrics.jsonl")
                rows = open(metrics).read().splitlines()[:self.start]
                os.remove(metrics)
                open(metrics, "w").write("".join(row + "\n" for row in rows))
                self.step, self.new = self.start, True
            return super().poll() if self.new else None

    def popen(cmd, cwd, stdout, stderr, preexec_fn):
        out = cmd[cmd.index("--out") + 1]
        latest = checkpoint.latest_checkpoint(out)
        start = checkpoint.read_trainer_state(latest)["step"] if latest and "--resume" in cmd else 0
        return Rewriting(out, runner._steps_logged(runner.Run("x", out, [])), start)

    monkeypatch.setattr(runner.figures, "Progress", Recorder)
    monkeypatch.setattr(runner.subprocess, "Popen", popen)
    for n, (extra, logged, saved, expected) in enumerate([(["--overwrite"], 3, 2, [3, 3]), (["--resume"], 2, 2, [1, 1]),
                                                          (["--resume"], 2, 1, [2, 2]), (["--resume"], 2, 0, [3, 3])]):
        out = tmp_path / str(n)
        out.mkdir()
        (out / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, logged + 1)))
        if saved:
            step = out / "checkpoint" / f"step-{saved:06d}"
            step.mkdir(parents=True)
            (step / "trainer_state.json").write_text(json.dumps({"step": saved, "data": {"epoch": 0, "index": 0},
                                                                 "config": {}}))
        runner.train_all([(runner.Run("a", str(out), []), extra)], str(tmp_path), 1, {"a": 3}, "test")
        assert shown[-1] == expected, (extra, logged, saved)


def test_trainings_started_from_a_background_script_still_stop_on_sigint():
    """A script started with SIGINT ignored (nohup ... &) passes it on to its children; runner's preexec restores the
    default, so the SIGINT that stops the other runs after a failure reaches train.py as KeyboardInterrupt."""
    import signal
    import subprocess
    import sys

    probe = [sys.executable, "-c",
             "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"]
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a background job has it
    try:
        inherited = subprocess.run(probe, capture_output=True, text=True).stdout.strip()
        restored = subprocess.run(probe, capture_output=True, text=True, preexec_fn=runner.sigint_stops).stdout.strip()
    finally:
        signal.signal(signal.SIGINT, before)
    assert (inherited, restored) == ("False", "True")


def test_the_comparison_figure_draws_the_mean_over_seeds():
    first = {"passk": {"k": [1, 2], "pass_at_k": [0.2, 0.4], "max_new_tokens": 12},
             "rsa": [{"population": 4, "step": [1, 2], "pass_at_1": [0.1, 0.3]}]}
    second = {"passk": {"k": [1, 2], "pass_at_k": [0.4, 0.8], "max_new_tokens": 12},
              "rsa": [{"population": 4, "step": [1, 2], "pass_at_1": [0.3, 0.5]}]}
    mean = reproduce.mean_summary([first, second])
    assert mean["passk"]["k"] == [1, 2] and mean["passk"]["max_new_tokens"] == 12
    assert mean["passk"]["pass_at_k"] == pytest.approx([0.3, 0.6])
    assert mean["rsa"][0]["population"] == 4 and mean["rsa"][0]["pass_at_1"] == pytest.approx([0.2, 0.4])


@pytest.mark.parametrize("script,flags,message", [
    ("second_task", ["--out", "/proc/x/second_task"], "--out '/proc/x/second_task': /proc is not writable"),
    ("second_task", ["--runs-dir", "/proc/x"], "--runs-dir '/proc/x'"),
    ("second_task", ["--out", ""], "an empty path"),
    ("reproduce", ["--runs-dir", "/proc/x"], "--runs-dir '/proc/x'"),
])
def test_an_unwritable_output_stops_the_script_before_any_training(script, flags, message, nothing_runs, capsys):
    if script == "reproduce":
        pytest.importorskip("matplotlib")
    module = {"reproduce": reproduce, "second_task": second_task}[script]
    try:
        code = module.main(["--seeds", "0,1", *flags])
    except SystemExit as exit_info:
        code = exit_info.code
    assert code == 2
    _one_line(capsys, f"{script}.py", message)



@pytest.mark.parametrize("script", ["reproduce", "second_task"])
def test_a_runs_dir_holding_a_users_files_stops_the_script_before_any_training(script, tmp_path, nothing_runs, capsys):
    """--runs-dir pointed at a folder of one's own (say ~/results): its report.md, seeds.png or a NAME.log, names the
    script writes there, would be replaced; a folder holding anything the script does not write is refused."""
    if script == "reproduce":
        pytest.importorskip("matplotlib")
    folder = tmp_path / "results"
    folder.mkdir()
    for name in ("notes.txt", "report.md", "seeds.png", "grpo-s0.log", "tiny-grpo-s0.log"):
        (folder / name).write_text("mine")
    before = _snapshot(folder)
    module = {"reproduce": reproduce, "second_task": second_task}[script]
    try:
        code = module.main(["--seeds", "0,1", "--runs-dir", str(folder)]
                           + (["--out", str(tmp_path / "t")] if script == "second_task" else []))
    except SystemExit as exit_info:
        code = exit_info.code
    assert code == 2
    _one_line(capsys, f"{script}.py", f"--runs-dir {folder}: it holds ", ", which this script does not write")
    assert _snapshot(folder) == before and not list(tmp_path.glob("t.*"))
