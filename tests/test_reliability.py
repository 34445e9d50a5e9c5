"""train.py against a hostile-but-fair user: every bad input is one line naming the flag or file, exit code
2, nothing on disk touched; --overwrite and --resume never lose a user's work; crashes, kills, torn and corrupted files
resume to exactly the run an unbroken one makes; a diverged step stops the run with the last good checkpoint kept.

Runs use the code-built tiny policy with tiny settings, in-process, and a pseudo-random reward (as
tests/test_checkpoint.py) so that the optimizer really steps. One subprocess: the SIGKILL test."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zlib

import huggingface_hub
import pytest
import torch
from huggingface_hub.errors import RepositoryNotFoundError
from safetensors.torch import load_file

import checkpoint
import spiral
import train

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--preset", "tiny", "--model", "tiny", "--batch-problems", "1", "--num-search", "3", "--set-size", "2",
         "--num-sets", "2", "--num-aggregations", "2", "--max-new-tokens", "6", "--no-plot", "--save-every", "1"]
STEPS = 3


def pseudo_reward(text, gold):
    return float(zlib.crc32(text.encode()) % 2)


@pytest.fixture(autouse=True)
def _reward(monkeypatch):
    monkeypatch.setattr(spiral, "reward", pseudo_reward)


def _write_data(path):
    path.write_text("".join(json.dumps({"problem": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(5)))
    return str(path)


def _run(data, out, *extra) -> int:
    return train.main(SMALL + ["--data", data, "--out", str(out), *extra])


def _metrics(out):
    rows = checkpoint.read_metrics(os.path.join(out, "metrics.jsonl"))
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in rows]


def _adapter(out):
    return load_file(os.path.join(out, "adapter", "adapter_model.safetensors"))


def _same_adapter(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _snapshot(path):
    """Every file under `path` with its bytes: equal snapshots mean nothing was touched."""
    found = {}
    for root, dirs, files in os.walk(path):
        found.update({os.path.relpath(os.path.join(root, d), path): None for d in dirs})
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                found[os.path.relpath(os.path.join(root, name), path)] = f.read()
    return found


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The data, an unbroken STEPS-step run (the reference every interrupted run must equal) and a 1-step run to
    copy and damage."""
    root = tmp_path_factory.mktemp("world")
    data = _write_data(root / "problems.jsonl")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(spiral, "reward", pseudo_reward)
        assert _run(data, root / "unbroken", "--steps", str(STEPS)) == 0
        assert _run(data, root / "one", "--steps", "1") == 0
    assert all(r["train/samples_trained"] > 0 for r in _metrics(root / "unbroken"))  # the optimizer really steps
    return {"root": root, "data": data, "unbroken": _metrics(root / "unbroken"),
            "adapter": _adapter(root / "unbroken")}


@pytest.fixture
def run(world, tmp_path):
    """A fresh copy of a 1-step run directory (checkpoint step-000001) in tmp_path/run."""
    shutil.copytree(world["root"] / "one", tmp_path / "run")
    return tmp_path / "run"


def _assert_equals_unbroken(world, out):
    assert [r["step"] for r in _metrics(out)] == list(range(1, STEPS + 1))  # each step exactly once
    assert _metrics(out) == world["unbroken"]
    assert _same_adapter(_adapter(out), world["adapter"])


def _one_line_error(capsys, *needles):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("train.py: error: ") and "Traceback" not in err, err
    for needle in needles:
        assert str(needle) in err, err
    return err


# ----------------------------------------------------------------------------------------------------------------------
# Bad input: one line naming the flag or file, exit 2, and the existing run given to --overwrite left untouched


BAD_FLAGS = {  # extra argv -> text the message must contain
    "seed -1": (["--seed", "-1"], "--seed must be in [0, 2**64)"),
    "seed 2**64": (["--seed", str(2**64)], "--seed must be in [0, 2**64)"),
    "zero threads": (["--cpu-threads", "0"], "--cpu-threads must be a positive integer"),
    "too many threads": (["--cpu-threads", "100000"], "--cpu-threads must be at most"),
    "beta1 1.5": (["--adam-beta1", "1.5"], "--adam-beta1 must be in [0, 1)"),
    "beta2 1": (["--adam-beta2", "1"], "--adam-beta2 must be in [0, 1)"),
    "beta1 nan": (["--adam-beta1", "nan"], "--adam-beta1 must be a finite number"),
    "eps 0": (["--adam-eps", "0"], "--adam-eps must be positive"),
    "weight decay nan": (["--weight-decay", "nan"], "--weight-decay must be a finite number"),
    "weight decay -1": (["--weight-decay", "-1"], "--weight-decay must be >= 0"),
    "lr x weight decay": (["--lr", "0.5", "--weight-decay", "3"], "--weight-decay must be below 1 / --lr"),
    "lr inf": (["--lr", "inf"], "--lr must be a finite number"),
    "lr 1e30": (["--lr", "1e30"], "--lr must be at most 1"),
    "alpha inf": (["--lora-alpha", "inf"], "--lora-alpha must be a finite number"),
    "alpha 0": (["--lora-alpha", "0"], "--lora-alpha must be positive"),
    "temperature 1e-300": (["--temperature", "1e-300"], "--temperature must be at least 0.001"),
    "grad norm inf": (["--max-grad-norm", "inf"], "--max-grad-norm must be a finite number"),
}


@pytest.mark.parametrize("case", list(BAD_FLAGS))
def test_bad_flag_with_overwrite_is_one_line_and_keeps_the_old_run(case, world, run, capsys):
    extra, message = BAD_FLAGS[case]
    before = _snapshot(run.parent)
    assert _run(world["data"], run, "--overwrite", *extra) == 2
    _one_line_error(capsys, message)
    assert _snapshot(run.parent) == before


def _files(root):
    (root / "empty_model").mkdir()
    (root / "not_a_model").mkdir()
    (root / "not_a_model" / "weights.bin").write_text("x")
    lines = ['{"problem": "1 + 1", "answer": "2"}', "", '{"problem": "\\ud800", "answer": "1"}']  # JSON, not text
    (root / "surrogate.jsonl").write_text("\n".join(lines) + "\n")


BAD_INPUTS = {  # argv (after SMALL; {run} is a 1-step run directory, {tmp} its parent) -> text the message must contain
    "empty model dir": (["--model", "{tmp}/empty_model", "--out", "{tmp}/new"], "--model {tmp}/empty_model: no config"),
    "non-model dir": (["--model", "{tmp}/not_a_model", "--out", "{tmp}/new"], "not a model directory"),
    "model inside out": (["--model", "{run}/base", "--out", "{run}", "--overwrite"], "contains --model"),
    "model is out": (["--model", "{run}", "--out", "{run}", "--overwrite"], "contains --model ({run})"),
    "data inside out": (["--data", "{run}/metrics.jsonl", "--out", "{run}", "--overwrite"], "contains --data"),
    "surrogate in data": (["--data", "{tmp}/surrogate.jsonl", "--out", "{tmp}/new"], "surrogate.jsonl, line 3"),
    "out under a file": (["--out", "{tmp}/surrogate.jsonl/run"], "surrogate.jsonl is not a directory"),
    "existing run, no flag": (["--out", "{run}"], "--resume to continue it or --overwrite"),
    "resume and overwrite": (["--out", "{run}", "--resume", "--overwrite"], "exclude each other"),
    "resume an empty dir": (["--out", "{tmp}/empty_model", "--resume"], "--resume: no checkpoint in"),
    "resume changes lr": (["--out", "{run}", "--resume", "--lr", "0.1"], "--lr 0.1 differs"),
    # --out that os.access would pass for root, a file, unbounded counts
    "out empty": (["--out", ""], "--out '': an empty path"),
    "out in /proc": (["--out", "/proc/spiral-run"], "/proc is not writable"),
    "out is a file, overwrite": (["--out", "{tmp}/surrogate.jsonl", "--overwrite"], "is a file, not a run directory"),
    "num-search 100000": (["--num-search", "100000", "--out", "{tmp}/new"], "at most 4096 traces"),
    "batch-problems 1e6": (["--batch-problems", "1000000", "--out", "{tmp}/new"], "at most the 5 problems"),
    "max-draws 1e9": (["--max-draws", "1000000000", "--out", "{tmp}/new"], "--max-draws must be at most 500"),
    "max-new-tokens 1e9": (["--max-new-tokens", "1000000000", "--out", "{tmp}/new"], "at most 262,144"),
    "data /dev/zero": (["--data", "/dev/zero", "--out", "{tmp}/new"], "/dev/zero: not a regular file"),
    "resume, fewer steps": (["--out", "{run}", "--resume", "--steps", "1", "--save-every", "1"], None),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_and_touches_nothing(case, world, run, capsys, monkeypatch):
    _files(run.parent)
    extra, message = BAD_INPUTS[case]
    if message is None:  # a 3-step run resumed with --steps 1
        shutil.rmtree(run)
        shutil.copytree(world["root"] / "unbroken", run)
        extra, message = extra, "--steps 1: the run in {run} is already at step 3"
    monkeypatch.setattr(train.rollout, "load_policy", lambda *a, **k: pytest.fail("loaded the model on bad input"))
    fill = lambda s: s.replace("{run}", str(run)).replace("{tmp}", str(run.parent))  # noqa: E731
    before = _snapshot(run.parent)
    assert train.main(SMALL + ["--data", world["data"], *map(fill, extra)]) == 2
    _one_line_error(capsys, fill(message))
    assert _snapshot(run.parent) == before


def test_overwrite_refuses_a_directory_with_a_users_file(world, run, capsys):
    for users_file in [run / "thesis.tex", run / "checkpoint" / "notes.txt"]:  # beside the run's files, or among them
        users_file.write_text("precious")
        before = _snapshot(run.parent)
        assert _run(world["data"], run, "--overwrite") == 2
        _one_line_error(capsys, "does not look like a run directory", os.path.relpath(users_file, run))
        assert _snapshot(run.parent) == before
        users_file.unlink()


def test_overwrite_refuses_the_current_directory(world, run, monkeypatch, capsys):
    monkeypatch.chdir(run / "checkpoint")
    assert _run(world["data"], run, "--overwrite") == 2
    _one_line_error(capsys, "contains the current directory")
    assert os.path.isdir(run / "checkpoint" / "step-000001")


def test_hub_id_without_network_fails_at_once(world, tmp_path, monkeypatch, capsys):
    def unreachable(*args, **kwargs):
        raise ConnectionError("[Errno -2] Name or service not known")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # (restored after the test, as the constant below)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "model_info", unreachable)
    start = time.monotonic()
    assert _run(world["data"], tmp_path / "new", "--model", "someone/no-such-model") == 2
    _one_line_error(capsys, "--model someone/no-such-model: the Hugging Face Hub is unreachable")
    assert time.monotonic() - start < 5 and not os.path.exists(tmp_path / "new")

    def not_found(*args, **kwargs):
        raise RepositoryNotFoundError.__new__(RepositoryNotFoundError)
    monkeypatch.setattr(huggingface_hub, "model_info", not_found)
    with pytest.raises(ValueError, match="not on the Hugging Face Hub"):
        train.rollout.check_model("someone/no-such-model")

    monkeypatch.setattr(huggingface_hub, "model_info", unreachable)  # unreachable, but in the cache: offline mode
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *a, **k: "/cache/config.json")
    train.rollout.check_model("someone/cached-model")
    assert huggingface_hub.constants.HF_HUB_OFFLINE and os.environ["HF_HUB_OFFLINE"] == "1"

    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *a, **k: None)  # offline, not cached
    assert _run(world["data"], tmp_path / "new", "--model", "someone/no-such-model") == 2
    _one_line_error(capsys, "not in the local Hugging Face cache and HF_HUB_OFFLINE is set")


def test_unwritable_out_is_found_before_the_model_loads(world, tmp_path, monkeypatch, capsys):
    if os.geteuid() == 0:
        pytest.skip("root may write anywhere")
    (tmp_path / "locked").mkdir(mode=0o500)
    monkeypatch.setattr(train.rollout, "load_policy", lambda *a, **k: pytest.fail("loaded the model"))
    assert _run(world["data"], tmp_path / "locked" / "run") == 2
    _one_line_error(capsys, "is not writable")


# ----------------------------------------------------------------------------------------------------------------------
# --overwrite: the old run is moved aside, and deleted only once the new run has saved its first checkpoint


class Crash(Exception):
    pass


def _crash_at_step(monkeypatch, step, exc=Crash):
    """Raise `exc` when the loop logs `step`'s metrics (after its rollouts and its optimizer step)."""
    real = checkpoint.append_metrics

    def append(path, row):
        if row["step"] == step:
            raise exc("simulated crash")
        real(path, row)
    monkeypatch.setattr(checkpoint, "append_metrics", append)


def test_overwrite_keeps_the_old_run_until_the_new_one_checkpoints(world, run, monkeypatch):
    for leftover in ["adapter.tmp-all-12", "base.old-7",
                     "checkpoint/.step-000002.tmp-9", "checkpoint/step-000001.old-3"]:
        (run / leftover).mkdir()  # temporary names a crash can leave: still a run directory
    original = _snapshot(run)
    with monkeypatch.context() as mp:
        _crash_at_step(mp, 1)
        with pytest.raises(Crash):
            _run(world["data"], run, "--overwrite", "--steps", str(STEPS))
    (moved,) = [p for p in run.parent.iterdir() if p.name.startswith("run.old-")]
    assert _snapshot(moved) == original  # the crashed run had not checkpointed: the old run is whole, beside it
    assert sorted(os.listdir(run)) == ["base", "config.json"]  # a run directory that crashed before step 1 ...

    assert _run(world["data"], run, "--overwrite", "--steps", str(STEPS)) == 0  # ... can be overwritten
    _assert_equals_unbroken(world, run)
    assert sorted(p.name for p in run.parent.iterdir() if p.name.startswith("run")) == ["run", moved.name]
    assert _snapshot(moved) == original  # the crashed run was deleted after the checkpoint; the first old run stays
    assert train.main(["--out", str(run), "--resume"]) == 0  # a run started with --overwrite can be resumed


# ----------------------------------------------------------------------------------------------------------------------
# --resume: where the user points, from whatever a crash left


def test_resume_writes_where_the_user_points_not_where_the_config_says(world, tmp_path, monkeypatch):
    state = json.loads((world["root"] / "one" / "checkpoint" / "step-000001" / "trainer_state.json").read_text())
    assert state["config"]["out"] == str(world["root"] / "one")
    monkeypatch.chdir(tmp_path)
    shutil.copytree(world["root"] / "one", tmp_path / "runs" / "tiny-spiral")  # the default --out of --preset tiny
    original = _snapshot(world["root"] / "one")
    assert train.main(["--preset", "tiny", "--resume", "--steps", str(STEPS)]) == 0
    _assert_equals_unbroken(world, tmp_path / "runs" / "tiny-spiral")
    assert _snapshot(world["root"] / "one") == original


@pytest.mark.parametrize("latest", ["../../elsewhere", "/tmp", "step-000001/../../x", "step-000009"])
def test_resume_refuses_a_latest_outside_the_checkpoint_directory(latest, world, run, capsys):
    (run.parent / "elsewhere").mkdir()
    os.symlink(run.parent / "elsewhere", run / "checkpoint" / "step-000009")  # a step directory that leads outside
    (run / "checkpoint" / "latest").write_text(latest + "\n")
    before = _snapshot(run.parent)
    assert _run(world["data"], run, "--resume", "--steps", str(STEPS)) == 2
    _one_line_error(capsys, os.path.join(str(run), "checkpoint", "latest"), "not a step directory inside")
    assert _snapshot(run.parent) == before


def test_crash_before_the_first_checkpoint_restarts_at_step_0(world, tmp_path, monkeypatch):
    out = tmp_path / "run"
    with monkeypatch.context() as mp:
        _crash_at_step(mp, 2)
        with pytest.raises(Crash):
            _run(world["data"], out, "--steps", str(STEPS), "--save-every", "5")
    assert not os.path.exists(out / "checkpoint") and len(_metrics(out)) == 1  # config.json, base/, step 1's metrics
    assert _run(world["data"], out, "--resume", "--steps", str(STEPS)) == 0
    _assert_equals_unbroken(world, out)


def test_a_step_directory_without_latest_is_found(world, run):
    """A crash after the first step-NNNNNN/ was renamed into place but before `latest` was written."""
    os.remove(run / "checkpoint" / "latest")
    (run / "checkpoint" / ".step-000002.tmp-99").mkdir()  # half-written: never a candidate
    (run / "checkpoint" / "step-000002").mkdir()  # no trainer_state.json: not complete
    assert checkpoint.latest_checkpoint(str(run)) == str(run / "checkpoint" / "step-000001")
    assert _run(world["data"], run, "--resume", "--steps", str(STEPS)) == 0
    _assert_equals_unbroken(world, run)


CORRUPT = ["trainer_state.json", "optimizer.pt", "rng.pt", os.path.join("adapter", "adapter_model.safetensors"),
           os.path.join("adapter", "adapter_config.json"), "latest", "missing rng.pt"]


@pytest.mark.parametrize("name", CORRUPT)
def test_corrupted_checkpoint_file_is_named_and_nothing_is_touched(name, world, run, capsys):
    step = run / "checkpoint" / "step-000001"
    path = run / "checkpoint" / "latest" if name == "latest" else step / name.replace("missing ", "")
    if name.startswith("missing"):
        path.unlink()
    else:
        path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2] + b"\xff\x00garbage")
    before = _snapshot(run)
    assert _run(world["data"], run, "--resume", "--steps", str(STEPS)) == 2
    _one_line_error(capsys, str(path))
    assert _snapshot(run) == before


def test_torn_last_metrics_line_is_dropped_on_resume(world, run, capsys):
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "search_accur')  # a crash in mid-write
    assert _run(world["data"], run, "--resume", "--steps", str(STEPS)) == 0
    assert "dropped a torn last line" in capsys.readouterr().err
    _assert_equals_unbroken(world, run)


def test_a_bad_line_inside_metrics_is_an_error_naming_it(world, run, capsys):
    rows = (run / "metrics.jsonl").read_text()
    (run / "metrics.jsonl").write_text("not json\n" + rows)
    assert _run(world["data"], run, "--resume", "--steps", str(STEPS)) == 2
    _one_line_error(capsys, f"{run / 'metrics.jsonl'}, line 1")


def test_ctrl_c_is_one_line_and_resumes_exactly(world, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    with monkeypatch.context() as mp:
        _crash_at_step(mp, 3, KeyboardInterrupt)
        assert _run(world["data"], out, "--steps", str(STEPS)) == 130
    assert capsys.readouterr().err.splitlines()[-1] == "train.py: interrupted; continue with --resume"
    assert _run(world["data"], out, "--resume", "--steps", str(STEPS)) == 0
    _assert_equals_unbroken(world, out)


def test_sigkill_mid_run_then_resume_equals_an_unbroken_run(world, tmp_path):
    """A real kill -9 of `python train.py`, deterministically in step 2: its rollouts and optimizer step are done and
    its metrics line is half written (the child then waits to be killed)."""
    out = tmp_path / "run"
    argv = SMALL + ["--data", world["data"], "--out", str(out), "--steps", str(STEPS)]
    code = f"""import json, sys, time, zlib
import checkpoint, spiral, train
spiral.reward = lambda text, gold: float(zlib.crc32(text.encode()) % 2)
append = checkpoint.append_metrics
def torn_append(path, row):
    if row["step"] < 2:
        return append(path, row)
    with open(path, "a") as f:
        f.write(json.dumps(row)[:40])
    time.sleep(120)
checkpoint.append_metrics = torn_append
sys.exit(train.main({argv!r}))"""
    with open(tmp_path / "stderr", "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr)
    # generous: the loop ends as soon as step 2's line is torn; a busy 2-core machine needed more than 90 s to get there
    metrics, deadline = out / "metrics.jsonl", time.monotonic() + 600
    try:
        while time.monotonic() < deadline and proc.poll() is None and not (
                metrics.exists() and '{"step": 2' in metrics.read_text()):
            time.sleep(0.02)
    finally:
        proc.kill()  # SIGKILL
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, (tmp_path / "stderr").read_text()[-2000:]
    assert (out / "checkpoint" / "latest").read_text().strip() == "step-000001"
    assert train.main(["--out", str(out), "--resume"]) == 0
    _assert_equals_unbroken(world, out)


# ----------------------------------------------------------------------------------------------------------------------
# Divergence: a non-finite loss, gradient or weight stops the run; nothing non-finite is saved


def test_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(world, tmp_path, monkeypatch, capsys):
    out, poisoned = tmp_path / "run", []
    real_loss, real_save = train.importance_sampling_loss, checkpoint.save_checkpoint

    def loss(*args):  # after the first checkpoint the loss, and so its gradient, is NaN
        value, ratio_T = real_loss(*args)
        return (value * float("nan") if poisoned else value), ratio_T
    monkeypatch.setattr(train, "importance_sampling_loss", loss)
    monkeypatch.setattr(checkpoint, "save_checkpoint", lambda *a, **k: (real_save(*a, **k), poisoned.append(1))[0])
    assert _run(world["data"], out, "--steps", str(STEPS)) == 1
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("train.py: error: step 2: non-finite train/loss = nan"), last
    assert last.endswith(f"The last good checkpoint is {out / 'checkpoint' / 'step-000001'}"), last
    assert [r["step"] for r in _metrics(out)] == [1]
    assert (out / "checkpoint" / "latest").read_text().strip() == "step-000001"
    assert _same_adapter(_adapter(out), _adapter(world["root"] / "one"))  # step 1's adapter, finite and untouched


def test_train_step_takes_no_non_finite_step():
    weight = torch.nn.Parameter(torch.ones(2))
    grads = {"train/loss": float("nan")}

    def accumulate(model, samples, **kwargs):
        weight.grad = torch.tensor([1e10, 2e10])
        return dict(grads)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(train, "accumulate_gradients", accumulate)
        optimizer = torch.optim.SGD([weight], lr=0.1)
        with pytest.raises(train.Diverged, match="non-finite train/loss = nan; no optimizer step was taken"):
            train.train_step(torch.nn.Linear(1, 1), optimizer, [])
        assert torch.equal(weight.detach(), torch.ones(2))  # untouched
        grads["train/loss"] = 0.5
        optimizer = torch.optim.SGD([weight], lr=1e30)  # finite loss and gradient, an overflowing step
        with pytest.raises(train.Diverged, match="LoRA weights non-finite"):
            train.train_step(torch.nn.Linear(1, 1), optimizer, [])


# ----------------------------------------------------------------------------------------------------------------------
# The run directory: what a save deletes, one writer, a resume that knows its data


def test_a_save_keeps_what_the_user_put_in_checkpoint(world, run):
    keep = run / "checkpoint" / "best-step1-keep"
    shutil.copytree(run / "checkpoint" / "step-000001", keep)
    (keep / "notes.txt").write_text("the good one")
    (run / "checkpoint" / "step-000001.old-3").mkdir()  # a crash's leftover: the run's own, so deleted
    assert _run(world["data"], run, "--resume", "--steps", "2") == 0
    assert sorted(os.listdir(run / "checkpoint")) == ["best-step1-keep", "latest", "step-000002"]
    assert (keep / "notes.txt").read_text() == "the good one" and (keep / "trainer_state.json").exists()


def test_a_second_writer_is_refused_and_a_killed_one_leaves_no_lock(world, run, capsys):
    holder = subprocess.Popen([sys.executable, "-c", f"import checkpoint, sys, time; checkpoint.lock_run_dir("
                               f"{str(run)!r}); print('locked', flush=True); time.sleep(120)"],
                              cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = _snapshot(run)
        assert _run(world["data"], run, "--resume", "--steps", "2") == 2
        _one_line_error(capsys, f"--out {run} is in use by another")
        assert _snapshot(run) == before
    finally:
        holder.kill()  # SIGKILL: the kernel drops the lock
        holder.wait()
    assert _run(world["data"], run, "--resume", "--steps", "2") == 0


def test_a_refused_new_run_leaves_no_directory(world, tmp_path, monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise OSError("disk on fire")
    monkeypatch.setattr(train.rollout, "load_policy", broken)
    assert _run(world["data"], tmp_path / "new") == 2
    _one_line_error(capsys, "disk on fire")
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("change", ["answers", "shrunk"])
def test_resume_refuses_changed_data_before_touching_anything(change, world, run, capsys):
    original = open(world["data"]).read()
    lines = original.splitlines(keepends=True)
    with open(run / "checkpoint" / "step-000001" / "trainer_state.json") as f:
        assert json.load(f)["data"]["sha256"]  # the fingerprint is saved
    before = _snapshot(run)
    try:  # the same --data path, its content changed
        with open(world["data"], "w") as f:
            f.write("".join(lines[:2]) if change == "shrunk" else original.replace('"2"', '"3"'))
        assert _run(world["data"], run, "--resume", "--steps", "2") == 2
    finally:
        with open(world["data"], "w") as f:
            f.write(original)
    _one_line_error(capsys, "the training data differ from the checkpoint's")
    assert _snapshot(run) == before


@pytest.mark.parametrize("bad", [{"index": "abc"}, {"index": -1}, {"index": 99}, {"epoch": None}])
def test_a_corrupt_data_position_is_refused_before_metrics_are_cut(bad, world, run, capsys):
    path = run / "checkpoint" / "step-000001" / "trainer_state.json"
    state = json.loads(path.read_text())
    state["data"].update(bad)
    path.write_text(json.dumps(state))
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 2}) + "\n")  # a later step, which a resume from step 1 would cut
    before = _snapshot(run)
    assert _run(world["data"], run, "--resume", "--steps", "2") == 2
    _one_line_error(capsys, "step-000001" if bad != {"index": 99} else "data position 99 is past the 5 problems")
    assert _snapshot(run) == before


def test_resume_from_a_nan_checkpoint_is_one_line(world, run, capsys):
    from safetensors.torch import save_file
    weights = run / "checkpoint" / "step-000001" / "adapter" / "adapter_model.safetensors"
    save_file({k: torch.full_like(v, float("nan")) for k, v in load_file(weights).items()}, weights)
    before = _snapshot(run)
    assert _run(world["data"], run, "--resume", "--steps", "2") == 2
    _one_line_error(capsys, "holds non-finite LoRA weights")
    assert _snapshot(run) == before


def test_resume_at_its_last_step_says_so(world, tmp_path, capsys):
    shutil.copytree(world["root"] / "unbroken", tmp_path / "run")
    assert _run(world["data"], tmp_path / "run", "--resume", "--steps", str(STEPS)) == 0
    assert f"already at step {STEPS} = --steps" in capsys.readouterr().out


def test_a_run_that_keeps_no_problem_says_so(world, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(spiral, "reward", lambda text, gold: 0.0)  # no trace is ever correct
    assert _run(world["data"], tmp_path / "run", "--steps", "5", "--save-every", "5") == 0
    err = capsys.readouterr().err
    assert "warning: steps 1-5 kept no problem, so no gradient step was taken; no trace was correct" in err


def test_step_watch_reports_grader_timeouts_and_long_skips():
    watch = train.cli.StepWatch(patience=2)
    assert watch.check({"step": 1, "problems_kept": 1, "grader/ungraded": 0}) == []
    assert watch.check({"step": 2, "problems_kept": 1, "grader/ungraded": 240, "grader/timeouts": 240}) == [
        "train.py: warning: step 2: 240 rewards scored 0 without a verdict (240 grader timeouts; see reward.py)"]
    assert watch.check({"step": 3, "problems_kept": 0, "accuracy": 1.0}) == []
    assert "steps 3-4 kept no problem" in watch.check({"step": 4, "problems_kept": 0, "accuracy": 1.0})[0]
    assert watch.check({"step": 5, "problems_kept": 1}) == [] and watch.streak == 0


WARM_START_BAD = {  # argv after --preset tiny --warm-start-only -> message
    "threads -3": (["--out", "{tmp}/ws", "--cpu-threads", "-3"], "--cpu-threads must be a positive integer"),
    "out empty": (["--out", ""], "--out '': an empty path"),
    "out in /proc": (["--out", "/proc/ws"], "/proc is not writable"),
    "no out": ([], "--warm-start-only needs --out DIR"),
    "seed -1": (["--out", "{tmp}/ws", "--seed", "-1"], "--seed must be in [0, 2**64)"),
    "a training flag": (["--out", "{tmp}/ws", "--steps", "3"], "not --steps"),
}


@pytest.mark.parametrize("case", list(WARM_START_BAD))
def test_warm_start_only_checks_its_flags_first(case, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(train.tiny, "warm_start", lambda *a, **k: pytest.fail("trained on bad input"))
    extra, message = WARM_START_BAD[case]
    argv = ["--preset", "tiny", "--warm-start-only", *(a.replace("{tmp}", str(tmp_path)) for a in extra)]
    assert train.main(argv) == 2
    _one_line_error(capsys, message)
    assert os.listdir(tmp_path) == []
