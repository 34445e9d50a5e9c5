"""benchmarks/decode.py and benchmarks/on_gpu.py: the KV bytes a decode step reads, counted from the real step at
the 4B shape (meta device) against the byte model and the goal (1.0x the unique bytes plus the buckets' rounding);
the prefill's peak memory for 5 x 17.6k-token prompts; on_gpu.py's refusals, its argument order, Ctrl-C and time
limits (one line, exit 130, the step's own last line kept); and (slow) on_gpu.py's plan end to end at toy size on a
CPU, writing its JSON and markdown."""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load(name):
    """benchmarks/NAME.py as a module (decode.py's `import bench` needs benchmarks/ on the path, as when it runs)."""
    if os.path.join(ROOT, "benchmarks") not in sys.path:
        sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", os.path.join(ROOT, "benchmarks", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(*args, timeout=600):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_kv_bytes_counted_at_the_4b_shape_and_prefill_memory(tmp_path):
    """Counted bytes equal the byte model at three steps of each call; fastgen reads at most 1.07x the unique KV
    bytes (search: 8 x 8 rows of 1,054-token prompts; aggregation: 4 x 4 of 17,596), the old fastgen 2.4x and 3.4x;
    the prefill of 5 aggregation prompts stays under 3 GB beyond the weights and the cache (the old one
    built a 2.5 GB bias and a 9.9 GB copy per layer for 4)."""
    out = tmp_path / "bytes.json"
    proc = run("benchmarks/decode.py", "--bytes", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    for name, row in result["bytes_4b_4096"].items():
        assert row["counted_equals_model"], name
        assert row["unique_GB"] <= row["fastgen_GB"] <= 1.07 * row["unique_GB"], name
        assert row["old_over_unique"] > 2.3 and row["per_row_GB"] > row["unique_GB"]
    search = result["bytes_4b_4096"]["search"]
    assert abs(search["unique_GB"] - 147_456 * (8 * 1054 + 64 * 2048) / 1e9) < 0.05  # kv x (prompts + mean suffix)
    prefill = result["prefill_4b"]
    assert prefill["prompts"] == 5 and prefill["group_size"] == 1 and 0.5 < prefill["peak_GB"] < 3.0
    assert "[bytes search]" in proc.stdout and "[prefill]" in proc.stdout


def test_decode_refuses_bad_arguments_before_any_work(tmp_path):
    """--help only prints; a bad count, an existing, empty or unwritable --json is one line and exit 2, nothing run
    (the byte count would print "[bytes ...]" lines) and the user's file left as it was."""
    proc = run("benchmarks/decode.py", "--help")
    assert proc.returncode == 0 and "--bytes" in proc.stdout and "[bytes" not in proc.stdout
    (tmp_path / "mine.json").write_text("a user's file")
    for args, message in ((["--json", str(tmp_path / "mine.json")], "never overwritten"),
                          (["--json", ""], "an empty path"), (["--json", "/proc/x.json"], "not writable"),
                          (["--gpu", "--size", "toy", "--device", "cpu", "--new-tokens", "x"], "expected integers"),
                          ([], "choose --bytes")):
        proc = run("benchmarks/decode.py", *(["--bytes"] if "--gpu" not in args and args else []), *args)
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr)
        assert proc.stderr.startswith("decode.py: error: ") and proc.stderr.count("\n") == 1, proc.stderr
        assert "[bytes" not in proc.stdout
    assert (tmp_path / "mine.json").read_text() == "a user's file"


@pytest.mark.parametrize("args, message", [
    (["--new-tokens", "0"], "--new-tokens must be a positive integer, got 0"),
    (["--new-tokens", "8,-1"], "--new-tokens must be a positive integer, got -1"),
    (["--hf-baseline", "-3"], "--hf-baseline must be a positive integer, got -3"),
    (["--hf-baseline", "x"], "invalid int value"),
    (["--device", "foo"], "--device foo: expected cpu, cuda or cuda:N"),
    (["--shapes", "search,bogus"], "--shapes bogus: choose from search,aggregation"),
])
def test_decode_refuses_bad_counts_devices_and_shapes_before_building_a_model(args, message, monkeypatch, capsys):
    """Each used to build the toy model first, then raise a traceback (or, --shapes, measure nothing and exit 0)."""
    decode = load("decode")
    monkeypatch.setattr(decode.bench, "build_policy", lambda *a, **k: pytest.fail("a model was built"))
    assert decode.main(["--gpu", "--size", "toy", "--device", "cpu", "--skip-checks", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("decode.py: error: ") and message in err and err.count("\n") == 1, err


def test_on_gpu_records_a_cut_off_result_file_and_goes_on(tmp_path, monkeypatch):
    """A step killed at its time limit in mid-write leaves a cut-off JSON: that step gets an error and run_step
    returns instead of raising (the next steps still run); a whole JSON is the step's result."""
    on_gpu = load("on_gpu")
    monkeypatch.setattr(on_gpu, "step_commands", lambda step, *a: [[sys.executable, "-c", "print('[x] measured')"]])
    (tmp_path / "fastgen.json").write_text('{"rows": {"search_8": {"tokens_per')
    (tmp_path / "learner.json").write_text('{"learner": {"grouped_flash": {"seconds": 1.5}}}')
    cut = on_gpu.run_step("fastgen", str(tmp_path), True, 30, {})
    whole = on_gpu.run_step("learner", str(tmp_path), True, 30, {})
    for record in (cut, whole):
        assert record["rc"] == 0 and "[x] measured" in record["result_lines"], record
    assert "result" not in cut and "fastgen.json unreadable" in cut["error"], cut
    assert whole["result"]["learner"]["grouped_flash"]["seconds"] == 1.5 and "error" not in whole


def test_on_gpu_refuses_bad_arguments_before_any_work(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("a user's file")
    for args, message in ((["full", "--toy"], "not an empty directory"), (["new", "bogus", "--toy"], "unknown step"),
                          (["new", "--toy", "bytes"], "unknown step(s) bytes"),  # the meta-device step left the plan
                          (["new", "--toy", "--budget-s", "0"], "--budget-s must be positive"),
                          (["new2"], "no CUDA device"), (["/proc/x", "--toy"], "not writable")):
        proc = run("benchmarks/on_gpu.py", *[str(tmp_path / a) if i == 0 else a for i, a in enumerate(args)])
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.startswith("on_gpu.py: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert (tmp_path / "full" / "keep.txt").read_text() == "a user's file"
    assert not (tmp_path / "new").exists() and not (tmp_path / "new2").exists()


def test_on_gpu_takes_steps_before_and_after_its_options(tmp_path):
    """`OUT --toy fastgen` names a step after an option: argparse's plain parse_args rejected it."""
    on_gpu = load("on_gpu")
    for argv in ([str(tmp_path / "a"), "--toy", "fastgen", "learner"], [str(tmp_path / "a"), "fastgen", "--toy",
                                                                         "learner", "--budget-s", "99"]):
        args = on_gpu.parse(argv)
        assert args.steps == ["fastgen", "learner"] and args.toy


def test_the_plan_leaves_room_for_one_rerun_in_15_device_minutes():
    """A device session: ~2 minutes to start a machine, this command (a pre-flight of well under a minute, then the
    budget), one rerun of the longest step of the plan, and a margin for transfers."""
    on_gpu = load("on_gpu")
    limits = [on_gpu.STEPS[s][0] for s in on_gpu.PLAN]
    assert sum(limits) <= on_gpu.BUDGET_S
    assert 120 + 60 + on_gpu.BUDGET_S + 60 + max(limits) + 60 <= 15 * 60


def _stand_in(on_gpu, monkeypatch, scripts):
    """Each step of the plan replaced by a Python one-liner (`scripts`: step -> code, run with OUT as argv[1])."""
    monkeypatch.setattr(on_gpu, "preflight", lambda plan, toy: None)
    monkeypatch.setattr(on_gpu, "step_commands",
                        lambda step, out, toy: [[sys.executable, "-c", scripts[step], out]])


def test_a_step_that_fails_or_records_an_error_makes_on_gpu_exit_1_naming_it(tmp_path, monkeypatch, capsys):
    """bench.py recorded a failed row in its JSON and exited 0 (the train.py step without math-verify did): that
    step is not done; nor is one that exits non-zero. The steps after each still run, and gpu.md keeps them."""
    on_gpu = load("on_gpu")
    write = ("import json, os, sys; json.dump({content}, open(os.path.join(sys.argv[1], '{step}.json'), 'w')); "
             "print('[{step}] done')")
    _stand_in(on_gpu, monkeypatch, {
        "learner": write.format(step="learner", content={"learner": {"grouped_flash": {"seconds": 2.0}}}),
        "train": write.format(step="train", content={"train_py": {"error": "train.main exited 2"}}),
        "fastgen": "import sys; print('[fastgen] kernel failed'); sys.exit(3)"})
    out = tmp_path / "figures"
    assert on_gpu.main([str(out), "--toy"]) == 1
    err = capsys.readouterr().err
    assert err == "on_gpu.py: error: not done: train (exit 0: train_py: train.main exited 2); fastgen (exit 3)\n"
    summary = json.loads((out / "gpu.json").read_text())
    assert list(summary["steps"]) == ["learner", "train", "fastgen"] and "error" not in summary["steps"]["learner"]
    assert summary["steps"]["train"]["error"] == "train_py: train.main exited 2"
    assert "| train | 0 |" in (out / "gpu.md").read_text() and "error: train_py: train.main exited 2" in \
        (out / "gpu.md").read_text()
    assert on_gpu.main([str(tmp_path / "again"), "--toy", "learner"]) == 0  # all done: exit 0


def test_pre_flight_stops_in_one_line_before_any_step(tmp_path, monkeypatch, capsys):
    """The grouped learner not applying, or its training step failing on the device, stops on_gpu.py before any
    step runs or OUT is made; a plan that measures no grouped learner does not build the model at all."""
    import shared_prompt
    import train

    on_gpu = load("on_gpu")
    monkeypatch.setattr(on_gpu, "step_commands", lambda *a: pytest.fail("a step ran"))
    monkeypatch.setattr(shared_prompt, "unsupported", lambda model: "its log-probs differ by up to 0.5")
    assert on_gpu.main([str(tmp_path / "a"), "--toy"]) == 2
    err = capsys.readouterr().err
    assert err == ("on_gpu.py: error: pre-flight: the grouped learner does not apply on this device (its log-probs "
                   "differ by up to 0.5)\n") and not (tmp_path / "a").exists()
    monkeypatch.setattr(shared_prompt, "unsupported", lambda model: "")
    monkeypatch.setattr(shared_prompt, "checkpointing_mode", lambda model: (False, False))
    assert on_gpu.main([str(tmp_path / "c"), "--toy"]) == 2
    assert capsys.readouterr().err == ("on_gpu.py: error: pre-flight: the learner's memory plan does not see the "
                                       "model's activation checkpointing on this version\n")
    monkeypatch.undo()
    monkeypatch.setattr(on_gpu, "step_commands", lambda *a: pytest.fail("a step ran"))

    def failing(*args, **kwargs):
        raise RuntimeError("cuDNN Frontend error: [cudnn_frontend] Error: No execution plans support the graph.")

    monkeypatch.setattr(train, "accumulate_gradients", failing)
    assert on_gpu.main([str(tmp_path / "b"), "--toy", "train"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("on_gpu.py: error: pre-flight: the grouped learner's training step failed on this device: "
                          "RuntimeError: cuDNN") and err.count("\n") == 1 and not (tmp_path / "b").exists()
    assert on_gpu.preflight(["fastgen"], toy=True) is None  # no grouped step: nothing to check beyond the device


def test_pre_flight_passes_where_the_grouped_learner_trains():
    on_gpu = load("on_gpu")
    assert on_gpu.preflight(list(on_gpu.PLAN), toy=True) is None


# A stand-in step: says it started, then sleeps; on Ctrl-C it writes its own last line, as bench.py does.
CHILD = ("import sys, time\nprint('[child] started', flush=True)\ntry:\n    time.sleep(60)\n"
         "except KeyboardInterrupt:\n    print('[child] interrupted; results so far saved', flush=True)\n"
         "    sys.exit(130)\n")
DRIVER = ("import sys; sys.path.insert(0, 'benchmarks'); import on_gpu\n"
          "on_gpu.step_commands = lambda step, out, toy: [[sys.executable, '-c', {child!r}]]\n"
          "on_gpu.STEPS['learner'] = ({limit}, 'a stand-in')\n"
          "sys.exit(on_gpu.main([{out!r}, '--toy', 'learner', 'fastgen']))\n")


def _started(path, proc):
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists() and "[child] started" in path.read_text():
            return True
        time.sleep(0.2)
    return False


def test_ctrl_c_is_one_line_exit_130_and_the_step_writes_its_own_line_first(tmp_path):
    out = tmp_path / "figures"
    driver = DRIVER.format(child=CHILD, limit=300, out=str(out))
    proc = subprocess.Popen([sys.executable, "-c", driver], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # a terminal's
    assert _started(out / "learner.log", proc), proc.communicate()
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert stderr.startswith("on_gpu.py: interrupted in step learner") and stderr.count("\n") == 1, stderr
    assert "Traceback" not in stderr + stdout
    assert "[child] interrupted; results so far saved" in (out / "learner.log").read_text()
    summary = json.loads((out / "gpu.json").read_text())
    assert list(summary["steps"]) == ["learner"] and summary["steps"]["learner"]["rc"] == "interrupted"
    assert "[child] interrupted; results so far saved" in summary["steps"]["learner"]["result_lines"]


def test_a_step_past_its_limit_is_told_to_stop_writes_its_line_and_the_next_step_runs(tmp_path):
    """Even when on_gpu.py was started with SIGINT ignored (`nohup ... &`, a CI job; a terminal is the easy case):
    exec keeps an ignored signal, so its steps would ignore the SIGINT that tells them to stop unless on_gpu.py
    restores it for them."""
    out = tmp_path / "figures"
    driver = DRIVER.format(child=CHILD, limit=3, out=str(out))
    proc = subprocess.run([sys.executable, "-c", driver.replace("'fastgen'", "'fastgen', '--budget-s', '200'")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    summary = json.loads((out / "gpu.json").read_text())
    assert summary["steps"]["learner"]["rc"] == "timeout", summary
    assert "[child] interrupted; results so far saved" in summary["steps"]["learner"]["result_lines"]
    assert "fastgen" in summary["steps"] and proc.returncode == 1  # the next step ran (the stand-in again)


@pytest.mark.slow
def test_on_gpu_runs_its_plan_at_toy_size_on_cpu(tmp_path):
    """What a GPU session runs, end to end at toy size: every step of the plan exits 0 and its results reach
    gpu.json and gpu.md with the device, date, commit and command."""
    out = tmp_path / "figures"
    proc = run("benchmarks/on_gpu.py", str(out), "--toy", timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "gpu.json").read_text())
    assert list(summary["steps"]) == ["learner", "train", "fastgen"] and summary["preflight_s"] > 0
    assert all(r["rc"] == 0 and r["seconds"] > 0 for r in summary["steps"].values())
    assert summary["device"] == "cpu (toy)" and summary["commit"] and "--toy" in summary["command"]
    learner = summary["steps"]["learner"]["result"]["learner"]
    assert {f"{a}_{b}{c}" for a in ("grouped", "per-sample") for b in ("flash", "cudnn") for c in ("", "_keep")} \
        <= set(learner)
    assert all(r["seconds"] > 0 and "error" not in r for r in learner.values() if isinstance(r, dict))
    assert summary["steps"]["fastgen"]["result"]["rows"]["search_8"]["tokens_per_s"] > 0
    train = summary["steps"]["train"]["result"]
    assert train["train_py"]["samples_trained"] > 0 and train["train_py"]["learner_s"] > 0
    markdown = (out / "gpu.md").read_text()
    assert summary["commit"] in markdown and all(f"| {s} | 0 |" in markdown for s in summary["steps"])
    aggregation = run("benchmarks/on_gpu.py", str(tmp_path / "named"), "--toy", "aggregation", timeout=1200)
    assert aggregation.returncode == 0, aggregation.stdout[-3000:] + aggregation.stderr[-3000:]
    call = json.loads((tmp_path / "named" / "gpu.json").read_text())["steps"]["aggregation"]["result"]
    assert call["aggregation_call"]["prompts_per_call"] == [2] and call["aggregation_call"]["tokens_generated"] > 0
