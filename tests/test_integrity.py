"""Hostile input to the data loader, evaluate.py and the grader: devices and FIFOs as --data, huge
integers, --out that os.access would pass, one writer per result, the prompt-length filter, diverged adapters, an
unreachable Hub, an adapter copied away from its run, grader timeouts reported, and verdicts that do not depend on
how busy the machine is. The train.py cases are in tests/test_reliability.py."""

import copy
import json
import os
import signal
import subprocess
import sys
import threading
import time

import huggingface_hub
import pytest
import torch

import checkpoint
import cli
import evaluate
import lora
import reward
import problemset
import rollout

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _one_line(capsys, script, *needles):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"{script}: error: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


# ----------------------------------------------------------------------------------------------------------------------
# --data: files that are not problem files


class _Hang(Exception):
    pass


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "problems.jsonl"
    os.mkfifo(fifo)
    previous = signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(_Hang()))
    signal.alarm(10)  # open() on a FIFO with no writer blocks forever: turn that into a failure
    try:
        with pytest.raises(problemset.ProblemFileError, match="not a regular file"):
            problemset.load_problems(str(fifo))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_devices_long_lines_and_huge_integers_are_named(tmp_path, monkeypatch):
    with pytest.raises(problemset.ProblemFileError, match="/dev/zero: not a regular file"):
        problemset.load_problems("/dev/zero")
    data = tmp_path / "p.jsonl"
    data.write_text('{"problem": "1 + 1", "answer": 2}\n{"problem": "big", "answer": ' + "7" * 5000 + "}\n")
    with pytest.raises(problemset.ProblemFileError, match=r"p.jsonl, line 2: not valid JSON \(an integer of 5,000 digits"):
        problemset.load_problems(str(data))
    data.write_text('{"problem": "1 + 1", "answer": 2}\n{"problem": "' + "x" * 200 + '", "answer": "1"}\n')
    monkeypatch.setattr(problemset, "MAX_LINE_BYTES", 100)
    with pytest.raises(problemset.ProblemFileError, match="p.jsonl, line 2: longer than 100 bytes"):
        problemset.load_problems(str(data))
    monkeypatch.setattr(problemset, "MAX_LINE_BYTES", 1000)
    assert [p.answer for p in problemset.load_problems(str(data))] == ["2", "1"]  # an integer answer is its digits
    monkeypatch.setattr(problemset, "MAX_PROBLEM_FILE_BYTES", 100)
    with pytest.raises(problemset.ProblemFileError, match="more than 100"):
        problemset.load_problems(str(data))


# ----------------------------------------------------------------------------------------------------------------------
# evaluate.py: bad input before anything loads


@pytest.mark.parametrize("flags,message", [
    (["--out", ""], "--out is empty"),
    (["--out", "/proc/spiral-results.json"], "/proc is not writable"),
    (["--num-samples", "100000"], "--num-samples must be at most 4,096"),
    (["--rsa-populations", "4,100000"], "--rsa-populations must be at most 4,096"),
    (["--max-new-tokens", "1000000000"], "--max-new-tokens must be at most 262,144"),
    (["--temperature", "0.0005"], f"--temperature must be at least {cli.MIN_TEMPERATURE:g}"),  # train.py's floor
    (["--seed", "-1"], "--seed must be in [0, 2**64)"),
    (["--seed", str(2**64)], "--seed must be in [0, 2**64)"),
    (["--data", "/dev/zero"], "/dev/zero: not a regular file"),
])
def test_evaluate_bad_input_is_one_line_before_loading(flags, message, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(rollout, "load_policy", lambda *a, **k: pytest.fail("loaded a model on bad input"))
    out = [] if "--out" in flags else ["--out", str(tmp_path / "r.json")]
    assert evaluate.main(["--preset", "tiny", *out, *flags]) == 2
    _one_line(capsys, "evaluate.py", message)
    assert os.listdir(tmp_path) == []


def test_an_unreachable_hub_id_fails_at_once(tmp_path, monkeypatch, capsys):
    def unreachable(*args, **kwargs):
        raise ConnectionError("[Errno -2] Name or service not known")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "model_info", unreachable)
    monkeypatch.setattr(rollout, "load_policy", lambda *a, **k: pytest.fail("tried to load (and retry) it"))
    start = time.monotonic()
    assert evaluate.main(["--preset", "tiny", "--policy", "x=someone/no-such-model", "--out",
                          str(tmp_path / "r.json")]) == 2
    _one_line(capsys, "evaluate.py", "someone/no-such-model: the Hugging Face Hub is unreachable")
    assert time.monotonic() - start < 5


@pytest.fixture(scope="module")
def tiny_policy():
    torch.manual_seed(0)
    return rollout.load_policy("tiny")


def _adapter(tiny_policy, directory, base="tiny", base_root=None, alpha=2.0, fill=None):
    model = copy.deepcopy(tiny_policy[0])
    lora.add_lora(model, rank=2, alpha=alpha)
    with torch.no_grad():
        for p in lora.lora_parameters(model, "default")[1::2]:
            p.normal_(0, 0.5) if fill is None else p.fill_(fill)
    lora.save_adapter(model, directory, base, base_root=base_root)
    return directory


def _fake_load(tiny_policy):
    return lambda name, dtype="auto": (copy.deepcopy(tiny_policy[0]), tiny_policy[1])


TINY = ["--preset", "tiny", "--method", "passk", "--num-samples", "2", "--max-new-tokens", "4"]


def _data(path, *problems):
    path.write_text("".join(json.dumps({"problem": p, "answer": "2"}) + "\n" for p in problems))
    return str(path)


def test_an_adapter_copied_away_from_its_run_asks_for_model(tiny_policy, tmp_path, capsys):
    run = tmp_path / "run"
    (run / "base").mkdir(parents=True)
    (run / "base" / "config.json").write_text("{}")
    _adapter(tiny_policy, run / "adapter", base=str(run / "base"), base_root=str(run))  # stored as "../base"
    assert json.loads((run / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"] == "../base"
    os.rename(run / "adapter", tmp_path / "copied")
    assert evaluate.main([*TINY, "--adapter", str(tmp_path / "copied"), "--out", str(tmp_path / "r.json")]) == 2
    _one_line(capsys, "evaluate.py", "is not there; an adapter copied away from its run needs --model")


def test_non_finite_and_overflowing_adapters_are_one_line(tiny_policy, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(rollout, "load_policy", _fake_load(tiny_policy))
    data = _data(tmp_path / "p.jsonl", "What is 1 + 1?")
    nan = _adapter(tiny_policy, tmp_path / "nan", fill=float("nan"))
    assert evaluate.main([*TINY, "--data", data, "--adapter", str(nan), "--out", str(tmp_path / "a.json")]) == 2
    _one_line(capsys, "evaluate.py", "holds non-finite weights")
    huge = _adapter(tiny_policy, tmp_path / "huge", alpha=1e38, fill=1e3)  # finite weights, infinite logits
    assert evaluate.main([*TINY, "--data", data, "--adapter", str(huge), "--out", str(tmp_path / "b.json")]) == 1
    _one_line(capsys, "evaluate.py", "policy adapter: sampling met non-finite probabilities")
    assert not (tmp_path / "b.json").exists()


def test_a_long_problem_is_dropped_with_a_line(tiny_policy, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(rollout, "load_policy", _fake_load(tiny_policy))
    prompts, generate = [], rollout.generate
    monkeypatch.setattr(rollout, "generate", lambda m, t, p, **k: prompts.extend(p) or generate(m, t, p, **k))
    data = _data(tmp_path / "p.jsonl", "What is 1 + 1?", "What is " + "1 + " * 500_000 + "1?")  # 2 MB
    assert evaluate.main([*TINY, "--data", data, "--policy", "base=tiny", "--out", str(tmp_path / "r.json")]) == 0
    assert "dropped 1 of 2 problems longer than 4096 prompt tokens" in capsys.readouterr().err
    assert prompts and max(map(len, prompts)) < 1000


def test_grader_timeouts_are_reported(tiny_policy, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(rollout, "load_policy", _fake_load(tiny_policy))
    monkeypatch.setattr(reward._GRADER, "stats", dict(reward._GRADER.stats))  # restored afterwards

    def timing_out(text, gold):  # every comparison ends without a verdict, as under a grader timeout
        reward._GRADER.stats["ungraded"] += 1
        reward._GRADER.stats["timeouts"] += 1
        return 0.0
    monkeypatch.setattr(evaluate, "reward", timing_out)
    data = _data(tmp_path / "p.jsonl", "What is 1 + 1?")
    assert evaluate.main([*TINY, "--data", data, "--policy", "base=tiny", "--out", str(tmp_path / "r.json")]) == 0
    assert "warning: policy base: 2 answers scored 0 without a verdict (2 grader timeouts)" in capsys.readouterr().err
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["policies"]["base"]["grader"]["ungraded"] == 2


def test_a_second_evaluate_on_the_same_out_is_refused(tiny_policy, tmp_path, monkeypatch, capsys):
    out = tmp_path / "r.json"
    holder = subprocess.Popen([sys.executable, "-c", f"import checkpoint, time; checkpoint.lock_file({str(out)!r} + "
                               "'.lock'); print('locked', flush=True); time.sleep(120)"],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    monkeypatch.setattr(rollout, "load_policy", _fake_load(tiny_policy))
    data = _data(tmp_path / "p.jsonl", "What is 1 + 1?")
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert evaluate.main([*TINY, "--data", data, "--policy", "base=tiny", "--out", str(out)]) == 2
        _one_line(capsys, "evaluate.py", "is being written by another evaluate.py")
        assert not out.exists()
    finally:
        holder.kill()  # a killed holder leaves its file, but not its lock
        holder.wait()
    assert evaluate.main([*TINY, "--data", data, "--policy", "base=tiny", "--out", str(out)]) == 0
    assert out.exists() and not os.path.exists(f"{out}.lock")


def test_evaluate_writes_into_a_folder_that_does_not_exist_yet(tiny_policy, tmp_path, monkeypatch):
    # The README's comparison writes runs/eval/tiny-comparison.json on a fresh clone, where runs/eval is not there.
    monkeypatch.setattr(rollout, "load_policy", _fake_load(tiny_policy))
    out = tmp_path / "runs" / "eval" / "r.json"
    data = _data(tmp_path / "p.jsonl", "What is 1 + 1?")
    assert evaluate.main([*TINY, "--data", data, "--policy", "base=tiny", "--out", str(out)]) == 0
    assert out.exists() and not os.path.exists(f"{out}.lock")


# ----------------------------------------------------------------------------------------------------------------------
# The grader: a verdict must not depend on how busy the machine is


def test_a_verdict_does_not_depend_on_wall_clock_time(monkeypatch):
    """A worker that gets no CPU for twice the hard limit (as on an overloaded machine) still gives its verdict:
    the limits count CPU time. With wall-clock limits this scored 0 (a timeout)."""
    grader = reward._GradingWorker()
    monkeypatch.setattr(reward, "GRADE_TIMEOUT_S", 1.0)
    try:
        assert grader.equivalent("1/2", "0.5")  # started, and warm
        verdicts = []
        os.kill(grader._process.pid, signal.SIGSTOP)  # no CPU for it, as if 100 other processes ran
        asking = threading.Thread(target=lambda: verdicts.append(grader.equivalent("2/4", "0.5")))
        asking.start()
        time.sleep(2.5)
        os.kill(grader._process.pid, signal.SIGCONT)
        asking.join(60)
        assert verdicts == [True] and grader.stats["timeouts"] == 0
    finally:
        grader.close()


def test_cpu_seconds_reads_this_process():
    start = reward._cpu_seconds(os.getpid())
    if start is None:
        pytest.skip("no /proc here: the grader falls back to wall-clock limits")
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    assert reward._cpu_seconds(os.getpid()) - start >= 0.2


def test_lock_file_is_exclusive_and_removed(tmp_path):
    path = str(tmp_path / "r.json.lock")
    checkpoint.lock_file(path)
    try:
        probe = subprocess.run([sys.executable, "-c", f"import checkpoint; checkpoint.lock_file({path!r})"],
                               cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert probe.returncode != 0 and "being written by another evaluate.py" in probe.stderr
    finally:
        checkpoint.unlock_file(path)
    assert not os.path.exists(path)


# ----------------------------------------------------------------------------------------------------------------------
# benchmarks/bench.py: every flag checked before anything is built or measured


@pytest.fixture(scope="module")
def bench():
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench", os.path.join(ROOT, "benchmarks", "bench.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("bench", None)


BENCH_BAD = {  # argv -> message
    "device": (["--size", "toy", "--device", "gpu0"], "--device gpu0: expected cpu, cuda or cuda:N"),
    "max-new-tokens 0": (["--size", "toy", "--device", "cpu", "--max-new-tokens", "0"], "--max-new-tokens must be a"),
    "chunk 0": (["--cpu", "--chunk-sizes", "128,0"], "--chunk-sizes must be a positive integer"),
    "save-model onto a file": (["--size", "toy", "--device", "cpu", "--save-model", "{d}/file"], "not an empty dir"),
    "save-model in /proc": (["--size", "toy", "--device", "cpu", "--save-model", "/proc/m"], "/proc is not writable"),
    "save-model empty": (["--size", "toy", "--device", "cpu", "--save-model", ""], "an empty path"),
    "json a directory": (["--size", "toy", "--device", "cpu", "--json", "{d}"], "expected a file path"),
    "json in /proc": (["--size", "toy", "--device", "cpu", "--json", "/proc/b.json"], "/proc is not writable"),
    "json a user's file": (["--size", "toy", "--device", "cpu", "--json", "{d}/file"], "not written by bench.py"),
    "not a number": (["--agg-prompts", "x"], "invalid int value"),
}


@pytest.mark.parametrize("case", list(BENCH_BAD))
def test_bench_flags_are_checked_before_the_run(case, bench, tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("a user's notes")
    for name in ("run_cpu_part", "run_gpu_part", "save_random_model", "build_policy"):
        monkeypatch.setattr(bench, name, lambda *a, **k: pytest.fail("ran on bad input"))
    argv, message = BENCH_BAD[case]
    assert bench.main([a.replace("{d}", str(tmp_path)) for a in argv]) == 2
    _one_line(capsys, "bench.py", message)
    assert sorted(os.listdir(tmp_path)) == ["file"] and (tmp_path / "file").read_text() == "a user's notes"


def test_bench_json_replaces_its_own_result_and_a_users_file_only_when_asked(bench, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "run_gpu_part", lambda args: {"generate": {"tokens_per_s": 1.0}})
    out = tmp_path / "r.json"
    assert bench.main(["--size", "toy", "--device", "cpu", "--json", str(out)]) == 0
    assert bench.main(["--size", "toy", "--device", "cpu", "--json", str(out)]) == 0  # its own: replaced
    assert json.loads(out.read_text())["written_by"] == "bench.py"
    out.write_text("mine")
    assert bench.main(["--size", "toy", "--device", "cpu", "--json", str(out), "--overwrite"]) == 0


def test_bench_refuses_a_4b_model_on_cpu_larger_than_memory(bench, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "save_random_model", lambda *a, **k: pytest.fail("built it"))
    monkeypatch.setattr(bench, "_meminfo_kib", lambda field: 8 * 1024 * 1024)  # 8 GiB available
    assert bench.main(["--size", "4b", "--device", "cpu", "--save-model", str(tmp_path / "m")]) == 2
    _one_line(capsys, "bench.py", "builds 16 GB in fp32, more than the 9 GB available")


def test_samples_do_not_depend_on_where_the_model_lives(tiny_policy, tmp_path, monkeypatch):
    """The same weights named by two paths (e.g. two checkouts of the repository) draw the same traces: seeds come
    from the content of a call, not from the model's absolute path. (This made tests/test_evaluate.py's
    comparisons pass in one checkout and fail in another.)"""
    monkeypatch.setattr(rollout, "load_policy", _fake_load(tiny_policy))
    texts, generate = [], rollout.generate

    def recording(model, tokenizer, prompts, **kw):
        completions = generate(model, tokenizer, prompts, **kw)
        texts.append([c.text for row in completions for c in row])
        return completions
    monkeypatch.setattr(rollout, "generate", recording)
    elsewhere = tmp_path / "a" / "copy-of-the-model"
    elsewhere.mkdir(parents=True)
    (elsewhere / "config.json").write_text("{}")
    data = _data(tmp_path / "p.jsonl", "What is 1 + 1?", "What is 2 + 2?")
    assert evaluate.main([*TINY, "--num-samples", "8", "--max-new-tokens", "12", "--data", data,
                          "--policy", "here=tiny", "--policy", f"there={elsewhere}",
                          "--out", str(tmp_path / "r.json")]) == 0
    assert len(texts) == 2 and texts[0] == texts[1]
