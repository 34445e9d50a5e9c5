"""No script destroys what a user made: every script parses its arguments before it does anything
(--help prints and exits), checks its outputs before any work, replaces a warm start, a shipped result or a user's
file only when told, takes and deletes only the lock files it made, and reports a dangling link, a linked run entry
or a full disk in one line with nothing half-written left behind."""

import copy
import fcntl
import importlib.util
import json
import os
import runpy
import shutil
import sys

import pytest
import torch

import checkpoint
import evaluate
import lora
import rollout
import tiny
import tiny_parts
import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "benchmarks", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


reproduce, second_task, runner = _load("reproduce"), _load("second_task"), _load("runner")


def _one_line(capsys, script, *needles):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"{script}: error: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err


def _snapshot(*paths):
    """{path: bytes} of every file under `paths`, to show nothing was touched."""
    files = {}
    for top in paths:
        for root, _, names in os.walk(top):
            for name in names:
                with open(os.path.join(root, name), "rb") as f:
                    files[os.path.join(root, name)] = f.read()
    return files


@pytest.fixture
def nothing_runs(monkeypatch):
    """Fail the test if a script starts a subprocess, trains or builds a warm start."""
    def refuse(*args, **kwargs):
        pytest.fail(f"started work: {args[:1]}")
    monkeypatch.setattr(runner.subprocess, "Popen", refuse)  # the scripts train and evaluate through runner
    monkeypatch.setattr(runner.subprocess, "run", refuse)
    monkeypatch.setattr(tiny_parts, "warm_start", refuse)
    monkeypatch.setattr(tiny_parts, "write_problems", refuse)


# ----------------------------------------------------------------------------------------------------------------------
# --help and typos: parsed before anything runs


def test_tiny_parts_help_needs_out_and_runs_nothing(nothing_runs, capsys):
    with pytest.raises(SystemExit) as exit_info:
        tiny_parts.main(["--help"])
    assert exit_info.value.code == 0 and "--out" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        tiny_parts.main([])  # the shipped warm start is replaced only when named
    assert exit_info.value.code == 2
    _one_line(capsys, "tiny_parts.py", "--out")


@pytest.mark.parametrize("module", ["testtime", "figures", "tiny"])
def test_a_library_run_as_a_script_prints_its_help_or_one_line(module, monkeypatch, capsys):
    path = os.path.join(ROOT, f"{module}.py")
    for argv, code in [(["--help"], 0), ([], 2), (["--typo"], 2)]:
        monkeypatch.setattr(sys, "argv", [path, *argv])
        with pytest.raises(SystemExit) as exit_info:
            runpy.run_path(path, run_name="__main__")
        out, err = capsys.readouterr()
        assert exit_info.value.code == code
        if code == 0:
            assert out.strip().splitlines()[0] and not err
        else:
            assert err.count("\n") == 1 and err.startswith(f"{module}.py: error:") and not out


SCRIPTS = sorted([*(p for p in os.listdir(ROOT) if p.endswith(".py")),
                  *(os.path.join("benchmarks", p) for p in os.listdir(os.path.join(ROOT, "benchmarks"))
                    if p.endswith(".py"))])


def _help_answer(script: str, code, out: str, err: str) -> None:
    """`python SCRIPT --help` prints what the script or module is for and exits 0, with nothing on stderr;
    trl_spiral.py where trl is not installed says in one line what to install (exit 2)."""
    if script == "trl_spiral.py" and importlib.util.find_spec("trl") is None:
        assert code == 2 and not out and err.count("\n") == 1 and "pip install trl==" in err, (code, out, err)
        return
    assert code in (0, None) and out.strip() and not err, (code, out, err)


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_and_module_answers_help(script, tmp_path, monkeypatch, capsys):
    """Every top-level module and benchmark script, run as `python SCRIPT --help`, says what it is for (17 library
    modules printed nothing), and does nothing else: no file written. In this process (run as __main__ by runpy, the
    libraries already imported): a fresh interpreter per file is the slow test below."""
    path = os.path.join(ROOT, script)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [path, "--help"])
    monkeypatch.setattr(sys, "path", [os.path.dirname(path), *sys.path])  # as `python SCRIPT` sets it
    try:
        runpy.run_path(path, run_name="__main__")
        code = None
    except SystemExit as exit_info:
        code = exit_info.code
    out, err = capsys.readouterr()
    _help_answer(script, code, out, err)
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_every_script_and_module_answers_help_in_a_fresh_interpreter(tmp_path):
    import subprocess

    for script in SCRIPTS:
        done = subprocess.run([sys.executable, os.path.join(ROOT, script), "--help"], capture_output=True, text=True,
                              cwd=tmp_path, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
        _help_answer(script, done.returncode, done.stdout, done.stderr)
    assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------------------------------------------------------------
# Warm starts: tiny_parts.py and train.py --warm-start-only replace only a warm start of their own task


def _warm_start_copy(source, destination):
    shutil.copytree(source, destination)
    return destination


@pytest.mark.parametrize("case,message", [
    ("sums", "holds the tiny_sums warm start, not a tiny_parts one"),  # the base of --preset tiny
    ("run_base", "is the base model of the run"),  # a run's base/ holds a warm_start.json too
    ("extra_file", "holds notes.txt, which a warm start does not write"),
    ("user_dir", "not a warm start"),
    ("file", "is not a directory"),
    ("empty_path", "an empty path"),
    ("proc", "not writable"),
])
def test_tiny_parts_refuses_what_is_not_its_own_warm_start(case, message, tmp_path, nothing_runs, capsys):
    out = {"sums": lambda: _warm_start_copy(tiny.WARM_START_DIR, tmp_path / "w"),
           "run_base": lambda: _warm_start_copy(tiny_parts.WARM_START_DIR, tmp_path / "run" / "base"),
           "extra_file": lambda: _warm_start_copy(tiny_parts.WARM_START_DIR, tmp_path / "w"),
           "user_dir": lambda: tmp_path / "w", "file": lambda: tmp_path / "w", "empty_path": lambda: "",
           "proc": lambda: "/proc/x"}[case]()
    if case == "run_base":
        (tmp_path / "run" / "config.json").write_text("{}")
    if case == "extra_file":
        (out / "notes.txt").write_text("mine")
    if case == "user_dir":
        out.mkdir()
        (out / "thesis.tex").write_text("mine")
    if case == "file":
        out.write_text("mine")
    before = _snapshot(tmp_path)
    assert tiny_parts.main(["--out", str(out)]) == 2
    _one_line(capsys, "tiny_parts.py", message)
    assert _snapshot(tmp_path) == before


def test_tiny_parts_rebuilds_its_own_warm_start_and_keeps_an_edited_problem_file(tmp_path, monkeypatch, capsys):
    built = []
    monkeypatch.setattr(tiny_parts, "warm_start", lambda out, seed: built.append(out))
    problems = tmp_path / "tiny_parts.jsonl"
    monkeypatch.setattr(tiny_parts, "PROBLEMS_FILE", str(problems))
    own = _warm_start_copy(tiny_parts.WARM_START_DIR, tmp_path / "w")
    assert tiny_parts.main(["--out", str(own)]) == 0 and built == [str(own)]  # named: replaced
    assert problems.read_text() == open(os.path.join(ROOT, "data", "tiny_parts.jsonl")).read()  # the generator's
    problems.write_text(problems.read_text().replace("643", "644", 1))  # a user's edit
    edited = problems.read_text()
    capsys.readouterr()
    assert tiny_parts.main(["--out", str(tmp_path / "new")]) == 2
    _one_line(capsys, "tiny_parts.py", "differs from the generator's problems")
    assert problems.read_text() == edited and built == [str(own)]


def test_tiny_parts_stops_before_any_work_where_the_problems_file_cannot_be_written(tmp_path, monkeypatch,
                                                                                     nothing_runs, capsys):
    monkeypatch.setattr(tiny_parts, "PROBLEMS_FILE", "/proc/x/tiny_parts.jsonl")  # a read-only checkout's data/
    assert tiny_parts.main(["--out", str(tmp_path / "w")]) == 2
    _one_line(capsys, "tiny_parts.py", "cannot write /proc/x/tiny_parts.jsonl: /proc is not writable")
    assert not (tmp_path / "w").exists()


def test_the_sums_warm_start_build_refuses_a_tiny_parts_warm_start_and_a_runs_base(tmp_path):
    parts = _warm_start_copy(tiny_parts.WARM_START_DIR, tmp_path / "parts")
    base = _warm_start_copy(tiny.WARM_START_DIR, tmp_path / "run" / "base")
    (tmp_path / "run" / "config.json").write_text("{}")
    assert "tiny_parts warm start, not a tiny_sums one" in tiny.warm_start_problem(str(parts), "tiny_sums")
    assert "base model of the run" in tiny.warm_start_problem(str(base), "tiny_sums")
    assert tiny.warm_start_problem(str(_warm_start_copy(tiny.WARM_START_DIR, tmp_path / "w")), "tiny_sums") is None
    assert tiny.warm_start_problem(str(tmp_path / "absent"), "tiny_sums") is None
    os.symlink(tmp_path / "w", tmp_path / "link")
    assert "symbolic link" in tiny.warm_start_problem(str(tmp_path / "link"), "tiny_sums")


def test_a_failed_warm_start_save_leaves_the_old_one_and_no_copy(tmp_path, monkeypatch):
    model, tokenizer = rollout.load_policy("tiny")
    old = _warm_start_copy(tiny.WARM_START_DIR, tmp_path / "w")
    before = _snapshot(old)

    def full_disk(self, path, *args, **kwargs):
        os.makedirs(path, exist_ok=True)
        open(os.path.join(path, "model.safetensors"), "wb").write(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(type(model), "save_pretrained", full_disk)
    with pytest.raises(OSError):
        tiny.save_warm_start(model, tokenizer, str(old), {})
    assert _snapshot(old) == before and sorted(os.listdir(tmp_path)) == ["w"]


# ----------------------------------------------------------------------------------------------------------------------
# evaluate.py's lock: only a file it made, held until the result is written


@pytest.mark.parametrize("kind", ["file", "directory", "symlink", "empty"])
def test_evaluate_never_takes_or_deletes_a_users_lock_named_file(kind, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(rollout, "load_policy", lambda *a, **k: pytest.fail("loaded a model"))
    out, lock = tmp_path / "r.json", tmp_path / "r.json.lock"
    {"file": lambda: lock.write_text("my notes"), "directory": lambda: lock.mkdir(),
     "symlink": lambda: os.symlink(tmp_path / "elsewhere", lock), "empty": lambda: lock.write_text("")}[kind]()
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"problem": "What is 1 + 1?", "answer": "2"}) + "\n")
    assert evaluate.main(["--preset", "tiny", "--data", str(data), "--policy", "base=tiny", "--out", str(out)]) == 2
    _one_line(capsys, "evaluate.py", "is not an evaluate.py lock file")
    assert os.path.lexists(lock) and not out.exists()
    if kind == "file":
        assert lock.read_text() == "my notes"


def test_a_killed_evaluates_lock_is_taken_over_and_removed(tmp_path):
    path = tmp_path / "r.json.lock"
    path.write_bytes(checkpoint.LOCK_MARK)  # left by a killed run: its content, nobody holding it
    checkpoint.lock_file(str(path))
    assert path.exists()
    checkpoint.unlock_file(str(path))
    assert not path.exists() and os.listdir(tmp_path) == []


def _held(path) -> bool:
    """Whether some open file description holds an exclusive flock on `path` (a new descriptor cannot lock it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def test_unlock_deletes_the_lock_file_before_releasing_it(tmp_path, monkeypatch):
    """Released first, another evaluate.py could lock the old file just before it is deleted, while a third
    creates a new one: two writers at once."""
    path = str(tmp_path / "r.json.lock")
    checkpoint.lock_file(path)
    remove, held_when_removed = os.remove, []

    def recording_remove(p, *args, **kwargs):
        if str(p) == path:
            held_when_removed.append(_held(p))
        return remove(p, *args, **kwargs)

    monkeypatch.setattr(os, "remove", recording_remove)
    checkpoint.unlock_file(path)
    assert held_when_removed == [True] and not os.path.exists(path)


def test_the_result_is_written_while_the_lock_is_held(tmp_path, monkeypatch):
    policy = rollout.load_policy("tiny")
    monkeypatch.setattr(rollout, "load_policy", lambda name, dtype="auto": (copy.deepcopy(policy[0]), policy[1]))
    out, lock = tmp_path / "r.json", str(tmp_path / "r.json.lock")
    replace, held_when_written = os.replace, []

    def recording_replace(src, dst, *args, **kwargs):
        if str(dst) == str(out):
            held_when_written.append(os.path.exists(lock) and _held(lock))
        return replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", recording_replace)
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"problem": "What is 1 + 1?", "answer": "2"}) + "\n")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert evaluate.main(["--preset", "tiny", "--method", "passk", "--num-samples", "2", "--max-new-tokens", "4",
                              "--data", str(data), "--policy", "base=tiny", "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    assert held_when_written == [True] and out.exists() and not os.path.exists(lock)


# ----------------------------------------------------------------------------------------------------------------------
# checkpoint.py: links and a full disk


def test_a_dangling_link_as_out_is_one_line(tmp_path, capsys):
    os.symlink(tmp_path / "gone", tmp_path / "link")
    assert train.main(["--preset", "tiny", "--steps", "1", "--out", str(tmp_path / "link")]) == 2
    _one_line(capsys, "train.py", "is a symbolic link to", "which does not exist")
    assert os.path.islink(tmp_path / "link") and not (tmp_path / "gone").exists()


def test_resuming_into_a_linked_adapter_is_refused_and_the_link_kept(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"steps": 1}))
    (tmp_path / "mine").mkdir()
    os.symlink(tmp_path / "mine", run / "adapter")
    why = checkpoint.out_dir_problem(str(run), resume=True, overwrite=False, keep={})
    assert "adapter is a symbolic link" in why and os.path.islink(run / "adapter")


@pytest.fixture
def small_run(tmp_path, monkeypatch):
    """train.py on the code-built tiny policy (its base saved to OUT/base), a step or two: (flags without --out)."""
    from tests.test_checkpoint import SMALL

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    data = tmp_path / "problems.jsonl"
    data.write_text("".join(json.dumps({"problem": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(3)))
    return [*SMALL, "--data", str(data), "--steps", "1"]


def test_a_resume_refuses_a_base_that_is_not_what_the_run_wrote(small_run, tmp_path, capsys):
    """A truncated or altered OUT/base/model.safetensors, or a file of OUT/base missing: the resume stops in one line
    before any work (it resumed with exit 0 and wrote adapters pointing at the corrupt base). Removed, as the line
    says, it is written again, the same."""
    run = tmp_path / "run"
    assert train.main([*small_run, "--out", str(run)]) == 0
    weights = run / "base" / "model.safetensors"
    record = json.loads((run / "base" / checkpoint.BASE_RECORD).read_text())
    assert record["model.safetensors"][0] == weights.stat().st_size and "config.json" in record
    original = weights.read_bytes()
    for corrupt in (original[:len(original) // 2], original[:-1] + bytes([original[-1] ^ 1])):  # truncated, a bit
        weights.write_bytes(corrupt)
        before = _snapshot(run)
        capsys.readouterr()
        assert train.main(["--out", str(run), "--resume", "--steps", "2"]) == 2
        _one_line(capsys, "train.py", f"--resume: {weights} is not what the run wrote ({len(corrupt):,} bytes",
                  f"written: {len(original):,} bytes", f"remove {run / 'base'} and resume again")
        assert _snapshot(run) == before
    weights.write_bytes(original)
    config = run / "base" / "config.json"
    written = config.stat().st_size
    config.unlink()
    before = _snapshot(run)
    capsys.readouterr()
    assert train.main(["--out", str(run), "--resume", "--steps", "2"]) == 2
    _one_line(capsys, "train.py", f"--resume: {config} is not what the run wrote (missing; written: {written:,} bytes")
    assert _snapshot(run) == before
    shutil.rmtree(run / "base")
    assert train.main(["--out", str(run), "--resume", "--steps", "2"]) == 0
    assert weights.read_bytes() == original


def test_overwrite_through_a_link_keeps_the_link_and_deletes_the_old_run_it_promised_to(small_run, tmp_path, capsys):
    """--out LINK --overwrite, LINK a symbolic link to a run directory: the new run is made where the link points and
    the link stays; the old run is deleted after the first checkpoint as promised (LINK.old-* was left behind);
    nothing else beside the run is touched."""
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "notes.txt").write_text("mine")
    assert train.main([*small_run, "--out", str(runs / "real")]) == 0
    (runs / "real" / "metrics.jsonl").write_text('{"step": 1, "old": true}\n')  # to tell the old run from the new
    os.symlink(runs / "real", tmp_path / "link")
    capsys.readouterr()
    assert train.main([*small_run, "--out", str(tmp_path / "link"), "--overwrite"]) == 0
    assert f"moved the old run to {runs / 'real'}.old-" in capsys.readouterr().out
    assert os.readlink(tmp_path / "link") == str(runs / "real")
    assert sorted(os.listdir(tmp_path)) == ["link", "problems.jsonl", "runs"]
    assert sorted(os.listdir(runs)) == ["notes.txt", "real"] and (runs / "notes.txt").read_text() == "mine"
    assert '"old"' not in (runs / "real" / "metrics.jsonl").read_text()
    assert checkpoint.latest_checkpoint(str(tmp_path / "link")) == str(tmp_path / "link" / "checkpoint" / "step-000001")


def _tiny_lora():
    model, _ = rollout.load_policy("tiny")
    lora.add_lora(model, rank=2, alpha=2.0)
    return model, torch.optim.AdamW(lora.lora_parameters(model), lr=1e-3)


def test_a_full_disk_at_a_checkpoint_says_so_and_leaves_nothing_half_written(tmp_path, monkeypatch):
    import numpy as np

    model, optimizer = _tiny_lora()
    args = dict(model=model, optimizer=optimizer, data_state={}, np_rng=np.random.default_rng(0), config={},
                base_model_name_or_path="tiny")
    checkpoint.save_checkpoint(str(tmp_path), step=1, **args)
    before = _snapshot(tmp_path)

    def full(obj, path, *a, **k):  # what torch.save raises when the disk fills up mid-file
        open(path, "wb").write(b"half")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 512 vs 398")

    monkeypatch.setattr(checkpoint.torch, "save", full)
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9, 0))
    with pytest.raises(checkpoint.CheckpointError) as error:
        checkpoint.save_checkpoint(str(tmp_path), step=2, **args)
    message = str(error.value)
    assert "checkpoint/step-000002" in message and "the disk is full (0 MiB free)" in message
    assert _snapshot(tmp_path) == before  # `latest` still names step 1; no temporary directory left


def test_a_full_disk_while_copying_the_base_is_one_line_and_leaves_no_copy(tmp_path, monkeypatch, capsys):
    def full(src, dst, *a, **k):
        os.makedirs(dst)
        open(os.path.join(dst, "model.safetensors"), "wb").write(b"half")
        raise shutil.Error([(src, dst, "[Errno 28] No space left on device")])

    monkeypatch.setattr(checkpoint.shutil, "copytree", full)
    out = tmp_path / "run"
    assert train.main(["--preset", "tiny", "--steps", "1", "--out", str(out), "--no-plot"]) == 2
    _one_line(capsys, "train.py", f"could not write {out / 'base'}", "No space left on device")
    assert not out.exists() or not [e for e in os.listdir(out) if e.startswith("base")]


# ----------------------------------------------------------------------------------------------------------------------
# Late or raw tracebacks that are now one line before any work; progress that reaches a log file


@pytest.mark.parametrize("flags,message", [
    (["--policy", "a="], "the path after '=' is empty"),
    (["--policy", "x={run}"], "is a train.py run directory; its adapter is"),
    (["--data", "{d}/train.parquet"], "a Parquet file, not JSONL"),
    (["--data", "{d}/binary.jsonl"], "line 2: not UTF-8 text (expected JSONL"),
])
def test_evaluate_slips_are_one_line_before_any_model_is_loaded(flags, message, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(rollout, "load_policy", lambda *a, **k: pytest.fail("loaded a model"))
    run = tmp_path / "run"
    (run / "adapter").mkdir(parents=True)
    (run / "adapter" / "adapter_config.json").write_text("{}")
    (run / "config.json").write_text("{}")
    (tmp_path / "train.parquet").write_bytes(b"PAR1\x15\x04" + bytes(range(256)))
    (tmp_path / "binary.jsonl").write_bytes(b'{"problem": "1 + 1", "answer": "2"}\n\xff\xfe\x00\n')
    flags = [f.format(run=run, d=tmp_path) for f in flags]
    assert evaluate.main(["--preset", "tiny", "--out", str(tmp_path / "r.json"), *flags]) == 2
    _one_line(capsys, "evaluate.py", message)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_tiny_preset_with_cuda_on_a_cpu_machine_does_not_suggest_the_preset_given(capsys, tmp_path):
    # a fresh --out: the preset's own (runs/tiny-spiral) exists once the demo has run in this checkout
    assert train.main(["--preset", "tiny", "--device", "cuda", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU found" in err and "--preset tiny" not in err.split("found")[1] and "--device cpu" in err


def test_progress_prints_lines_a_log_file_can_hold():
    import io

    import figures

    now = [0.0]
    log = io.StringIO()  # not a terminal
    progress = figures.Progress(800, "policy base: search L=12", "traces", every_s=30, stream=log, clock=lambda: now[0],
                                heartbeat=False)  # the timer thread prints the same lines while a long call runs
    progress.update(100)  # within the first 30 s: nothing yet (a short stage prints nothing)
    assert log.getvalue() == ""
    now[0] = 45.0
    progress.update(200, note="loss 0.5")
    now[0] = 50.0
    progress.update(100)  # 5 s after the last line: none
    now[0] = 120.0
    progress.update(400)  # the last update, long after the last line: printed
    progress.close()  # nothing new to say
    assert log.getvalue().splitlines() == [
        "policy base: search L=12: 300/800 traces (38%), loss 0.5, 0:45 elapsed, about 1:15 left",
        "policy base: search L=12: 800/800 traces (100%), loss 0.5, 2:00 elapsed"]
    log.truncate(0)
    log.seek(0)
    progress = figures.Progress(10, "warm start", "steps", every_s=30, stream=log, clock=lambda: now[0],
                                heartbeat=False)
    now[0] += 40
    progress.update(3)
    now[0] += 1
    progress.update(7)  # done, but within 30 s of the last line: close() adds the last one
    progress.close()
    assert [line.split(",")[0] for line in log.getvalue().splitlines()] == ["warm start: 3/10 steps (30%)",
                                                                           "warm start: 10/10 steps (100%)"]


def test_progress_reports_on_a_run_of_short_stages(monkeypatch):
    """Stages of 20 s each never reach 30 s alone; the spacing counts across stages, so the one under way at 30 s
    is reported (an evaluation of 11 policies x 4 short stages printed nothing in 4 minutes)."""
    import io

    import figures

    monkeypatch.setitem(figures._LAST_PROGRESS_LINE, "at", None)
    now, log = [100.0], io.StringIO()
    for stage in range(4):
        progress = figures.Progress(2, f"stage {stage}", "calls", stream=log, clock=lambda: now[0], heartbeat=False,
                                    shared=True)
        for _ in range(2):
            now[0] += 10
            progress.update()
        progress.close()
    assert [line.split(",")[0] for line in log.getvalue().splitlines()] == ["stage 1: 1/2 calls (50%)",
                                                                          "stage 1: 2/2 calls (100%)",
                                                                          "stage 3: 1/2 calls (50%)",
                                                                          "stage 3: 2/2 calls (100%)"]


def test_evaluate_reports_progress_when_its_output_goes_to_a_file(tmp_path, monkeypatch, capsys):
    import figures

    policy = rollout.load_policy("tiny")
    monkeypatch.setattr(rollout, "load_policy", lambda name, dtype="auto": (copy.deepcopy(policy[0]), policy[1]))
    progress = figures.Progress
    monkeypatch.setattr(figures, "Progress", lambda *a, **k: progress(*a, **{**k, "every_s": 0}))
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"problem": f"What is {a} + 1?", "answer": str(a + 1)}) + "\n"
                            for a in (1, 2)))
    torch.set_num_threads(1)
    assert evaluate.main(["--preset", "tiny", "--method", "passk", "--num-samples", "2", "--max-new-tokens", "4",
                          "--tokens-per-call", "4", "--data", str(data), "--policy", "base=tiny",
                          "--out", str(tmp_path / "r.json")]) == 0  # a call per problem
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(", ")[0] for line in lines] == ["policy base (1 of 1): search L=4: 2/4 traces (50%)",
                                                       "policy base (1 of 1): search L=4: 4/4 traces (100%)"]
