"""The order of a checkpoint's writes, the run directory's lock across --overwrite, the data position and its
fingerprint, and which settings a resume may change. Each test names the bug it was seen failing on.

Mostly unit tests of checkpoint.py and train.ProblemStream; two short train.py runs on the code-built tiny policy
(with the pseudo-random reward of tests/test_checkpoint.py) for the resume of a run that dropped a long problem."""

import dataclasses
import fcntl
import json
import os
import zlib

import numpy as np
import pytest
import torch

import checkpoint
import cli
import lora
import rollout
import spiral
import tiny
import train
from problemset import Problem

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def policy():
    model, _ = rollout.load_policy("tiny", device="cpu")
    torch.manual_seed(0)
    lora.add_lora(model, rank=2, alpha=4)
    optimizer = torch.optim.AdamW(lora.lora_parameters(model), lr=1e-3)
    return model, optimizer


def _save(out, policy, step):
    model, optimizer = policy
    return checkpoint.save_checkpoint(str(out), model=model, optimizer=optimizer, step=step,
                                      data_state={"epoch": 0, "index": step}, np_rng=np.random.default_rng(0),
                                      config={"step": step}, base_model_name_or_path="tiny")


class Crash(Exception):
    pass


# ----------------------------------------------------------------------------------------------------------------------
# The order of a save: step directory whole, then `latest`, then the old step directories deleted


def test_a_crash_while_the_step_directory_is_moved_in_leaves_latest_on_the_previous_one(policy, tmp_path, monkeypatch):
    """Bug: `latest` written before step-000002/ is in place; a crash between them leaves `latest` naming a
    directory that does not exist, and the run does not resume."""
    out = tmp_path / "run"
    _save(out, policy, 1)
    real = checkpoint.replace_dir

    def crash_on_the_step_directory(tmp, destination):
        if os.path.basename(destination) == "step-000002":
            raise Crash("power cut")
        real(tmp, destination)
    monkeypatch.setattr(checkpoint, "replace_dir", crash_on_the_step_directory)
    with pytest.raises(Crash):
        _save(out, policy, 2)
    assert (out / "checkpoint" / "latest").read_text() == "step-000001\n"
    path = checkpoint.latest_checkpoint(str(out))
    assert path == str(out / "checkpoint" / "step-000001")
    model, optimizer = policy
    assert checkpoint.load_checkpoint(path, model=model, optimizer=optimizer, np_rng=np.random.default_rng(1))[
        "step"] == 1

    monkeypatch.setattr(checkpoint, "replace_dir", real)  # the resumed run saves step 2 over the leftovers
    _save(out, policy, 2)
    assert sorted(os.listdir(out / "checkpoint")) == ["latest", "step-000002"]


def test_without_latest_the_newest_complete_step_directory_is_resumed(policy, tmp_path):
    """Bugs: the oldest step directory taken; one without trainer_state.json (half-copied) taken as complete."""
    out = tmp_path / "run"
    for step in (9, 10):
        _save(out, policy, step)
        os.rename(out / "checkpoint" / f"step-{step:06d}", out / f"keep-{step}")
    for step in (9, 10):  # two complete step directories, 9 and 10 (10 > 9 as numbers), and no `latest`
        os.rename(out / f"keep-{step}", out / "checkpoint" / f"step-{step:06d}")
    os.remove(out / "checkpoint" / "latest")
    (out / "checkpoint" / "step-000011").mkdir()  # no trainer_state.json: a crash while it was copied
    assert checkpoint.latest_checkpoint(str(out)) == str(out / "checkpoint" / "step-000010")


def test_latest_naming_a_missing_step_directory_is_refused_by_name(tmp_path):
    """Bug: a `latest` naming a step directory that is not there passes, and the resume fails later, elsewhere."""
    (tmp_path / "checkpoint" / "step-000001").mkdir(parents=True)
    (tmp_path / "checkpoint" / "latest").write_text("step-000002\n")
    with pytest.raises(checkpoint.CheckpointError, match="latest names 'step-000002', not a step directory inside"):
        checkpoint.latest_checkpoint(str(tmp_path))


@pytest.mark.parametrize("bad", [{"step": True}, {"step": -1}, {"step": "3"}, {"data": {"epoch": False, "index": 1}},
                                 {"data": {"epoch": 0, "index": 1.0}}, {"config": []}, {"data": {"epoch": 0}}])
def test_a_trainer_state_of_the_wrong_types_is_refused(bad, tmp_path):
    """Bug: JSON true taken for the integer 1 (bool is an int in Python), a float index, a config that is a list."""
    state = {"step": 3, "data": {"epoch": 0, "index": 1}, "config": {}}
    (tmp_path / "trainer_state.json").write_text(json.dumps({**state, **bad}))
    with pytest.raises(checkpoint.CheckpointError, match="trainer_state.json is corrupt"):
        checkpoint.read_trainer_state(str(tmp_path))
    (tmp_path / "trainer_state.json").write_text(json.dumps(state))
    assert checkpoint.read_trainer_state(str(tmp_path)) == state


# ----------------------------------------------------------------------------------------------------------------------
# One writer: --overwrite moves the old run aside and must lock the new directory


def _locked(path) -> bool:
    """True if another open file description cannot take the directory's flock (flock locks conflict between open
    file descriptions, even in one process)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def test_overwrite_locks_the_new_directory_and_releases_the_old_one(tmp_path):
    """Bug: the lock stays on the old run (moved aside with its directory) and the new OUT is open to a second
    train.py."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text("{}")
    checkpoint.lock_run_dir(str(out))
    try:
        assert _locked(out)
        checkpoint.prepare_run_dir(str(out), config={"new": True}, overwrite=True, resume_step=None)
        (old,) = [p for p in tmp_path.iterdir() if p.name.startswith("run.old-")]
        assert json.loads((old / "config.json").read_text()) == {} and json.loads(
            (out / "config.json").read_text()) == {"new": True}
        assert _locked(out) and not _locked(old)
    finally:
        checkpoint.unlock_run_dir(str(out))
        checkpoint._MOVED_ASIDE.pop(os.path.abspath(out), None)
    assert not _locked(out) and out.is_dir()


def test_a_refused_run_keeps_the_empty_out_directory_the_user_made(tmp_path, monkeypatch, capsys):
    """Bug: unlock_run_dir removes an empty OUT whether or not the run created it (the user's mkdir undone)."""
    def broken(*args, **kwargs):
        raise OSError("disk on fire")
    monkeypatch.setattr(train.rollout, "load_policy", broken)
    data = tmp_path / "problems.jsonl"
    data.write_text(json.dumps({"problem": "What is 1 + 1?", "answer": "2"}) + "\n")
    (tmp_path / "mine").mkdir()
    assert train.main(SMALL + ["--data", str(data), "--out", str(tmp_path / "mine")]) == 2
    assert "disk on fire" in capsys.readouterr().err
    assert (tmp_path / "mine").is_dir() and not _locked(tmp_path / "mine")


# ----------------------------------------------------------------------------------------------------------------------
# The data position: (epoch, index) into the epoch's permutation, checked against the data's fingerprint

PROBLEMS = [Problem(f"What is {i} + {i}?", str(2 * i), None) for i in range(5)]


def test_every_epoch_is_the_permutation_of_its_own_seed():
    """Bug: a new epoch reuses the previous epoch's order (or the seed's first permutation)."""
    stream = train.ProblemStream(PROBLEMS, seed=3)
    drawn = [stream() for _ in range(15)]
    for epoch in range(3):
        order = np.random.default_rng([3, epoch]).permutation(len(PROBLEMS))
        assert drawn[5 * epoch: 5 * epoch + 5] == [PROBLEMS[i] for i in order]
    assert drawn[:5] != drawn[5:10]
    assert stream.state() == {"epoch": 2, "index": 5, "sha256": checkpoint.data_fingerprint(PROBLEMS)}


def test_a_checkpoint_anywhere_resumes_the_same_stream_including_at_the_end_of_an_epoch():
    """Bug: a checkpoint saved at the very end of an epoch (index == number of problems) refused on resume."""
    unbroken = train.ProblemStream(PROBLEMS, seed=3)
    drawn = [unbroken() for _ in range(12)]
    for k in range(13):  # k = 5 and 10: at the end of epochs 0 and 1
        stream = train.ProblemStream(PROBLEMS, seed=3)
        for _ in range(k):
            stream()
        state = json.loads(json.dumps({"step": 1, "data": stream.state(), "config": {}}))  # as the file holds it
        resumed = train.ProblemStream(PROBLEMS, 3, **checkpoint.data_position(state, PROBLEMS))
        assert [resumed() for _ in range(12 - k)] == drawn[k:], k
    with pytest.raises(checkpoint.CheckpointError, match="data position 6 is past the 5 problems"):
        checkpoint.data_position({"data": {"epoch": 0, "index": 6}}, PROBLEMS)


# sha256 of these two problems as data_fingerprint has written it into every checkpoint so far: a change of the
# format would refuse to resume every existing run ("the training data differ").
SAVED = [Problem("What is 1 + 1?", "2", None), Problem("\\frac{1}{2} of 8?", "4", "7")]
SAVED_SHA256 = "b10aa102e2686c3dedb6f36f55036a40c4450a40b2efe372612025777e3056d7"


def test_the_resume_fingerprint_sees_every_field_the_order_and_field_boundaries():
    """Bugs: the answers, the ids or the order left out of the hash; fields concatenated ("a"+"bc" = "ab"+"c")."""
    assert checkpoint.data_fingerprint(SAVED) == SAVED_SHA256
    assert checkpoint.data_fingerprint([dataclasses.replace(p) for p in SAVED]) == SAVED_SHA256  # by value
    changed = {
        "an answer": [SAVED[0], dataclasses.replace(SAVED[1], answer="5")],
        "a problem": [dataclasses.replace(SAVED[0], problem="What is 1 + 2?"), SAVED[1]],
        "an id": [SAVED[0], dataclasses.replace(SAVED[1], id="8")],
        "no id for 'None'": [dataclasses.replace(SAVED[0], id="None"), SAVED[1]],
        "the order": SAVED[::-1],
        "a field boundary": [Problem("What is 1 + 1?2", "", None), SAVED[1]],
        "a problem boundary": [Problem("What is 1 + 1?", "2\n", None), SAVED[1]],
        "one problem fewer": SAVED[:1],
    }
    fingerprints = {name: checkpoint.data_fingerprint(problems) for name, problems in changed.items()}
    assert SAVED_SHA256 not in fingerprints.values()
    assert len(set(fingerprints.values())) == len(changed)


def test_a_checkpoint_from_before_fingerprints_resumes_and_a_changed_one_is_refused():
    state = {"data": {"epoch": 1, "index": 2}}  # no "sha256": saved before fingerprints were recorded
    assert checkpoint.data_position(state, SAVED) == {"epoch": 1, "index": 2}
    state["data"]["sha256"] = SAVED_SHA256
    assert checkpoint.data_position(state, SAVED) == {"epoch": 1, "index": 2}
    with pytest.raises(checkpoint.CheckpointError, match="the training data differ"):
        checkpoint.data_position(state, SAVED[::-1])


# ----------------------------------------------------------------------------------------------------------------------
# What a resume may change


# Settings that do not change the algorithm (where and how fast it runs, how often it saves): the only ones --resume
# may change. Every other TrainConfig field changes what is trained.
MAY_CHANGE = {"steps", "save_every", "out", "resume", "overwrite", "device", "cpu_threads", "plot",
              "micro_batch_tokens", "logprob_chunk_size", "generation_batch_size", "generation_tokens", "generation",
              "learner", "learner_attention", "keep_attention_outputs"}


def test_a_resume_refuses_a_change_of_every_setting_that_changes_the_algorithm():
    """Bug: --seed or --max-prompt-tokens (the problems kept, so the data order) accepted on --resume."""
    saved = dataclasses.asdict(train.resolve_config({"preset": "tiny"}))
    for f in dataclasses.fields(train.TrainConfig):
        other = {bool: lambda v: not v, int: lambda v: v + 1, float: lambda v: v * 2 + 1,
                 str: lambda v: v + "x"}.get(type(saved[f.name]), lambda v: 7)(saved[f.name])
        if f.name in ("algo", "preset", "dtype", "generation"):
            other = {"algo": "grpo", "preset": "paper", "dtype": "float32", "generation": "fast"}[f.name]
        if f.name == "warm_start_only":  # (--warm-start-only never reaches a resume)
            continue
        if f.name in MAY_CHANGE:
            assert getattr(train.resolve_config({"resume": True, f.name: other}, saved), f.name) == other
            continue
        with pytest.raises(cli.ConfigError, match=f"--{f.name.replace('_', '-')} .* differs from the checkpoint's"):
            train.resolve_config({"resume": True, f.name: other}, saved)


def _pseudo_reward(text, gold):
    return float(zlib.crc32(text.encode()) % 2)


SMALL = ["--preset", "tiny", "--model", "tiny", "--batch-problems", "1", "--num-search", "3", "--set-size", "2",
         "--num-sets", "2", "--num-aggregations", "2", "--max-new-tokens", "6", "--no-plot", "--save-every", "1"]


def test_a_run_that_dropped_a_long_problem_resumes_and_keeps_one_exactly_at_the_limit(tmp_path, monkeypatch, capsys):
    """Bugs: the resume fingerprint taken over every problem instead of those kept (a run that dropped a long problem
    never resumes); a problem exactly --max-prompt-tokens long dropped."""
    monkeypatch.setattr(spiral, "reward", _pseudo_reward)
    tokenizer = tiny.build_tiny_tokenizer()
    texts = [f"What is {i} + {i}?" for i in range(4)] + ["What is 12 + 34 + 56?", "What is 1 + 1? " * 20]
    lengths = [len(rollout.chat_prompt_ids(tokenizer, rollout.search_prompt(t))) for t in texts]
    assert lengths[4] > max(lengths[:4]) and lengths[5] > lengths[4]  # one at the limit below, one past it
    data = tmp_path / "problems.jsonl"
    data.write_text("".join(json.dumps({"problem": t, "answer": "2"}) + "\n" for t in texts))
    argv = SMALL + ["--data", str(data), "--out", str(tmp_path / "run"), "--max-prompt-tokens", str(lengths[4])]
    assert train.main(argv + ["--steps", "1"]) == 0
    assert f"dropped 1 of 6 problems longer than {lengths[4]} prompt tokens" in capsys.readouterr().out
    state = checkpoint.read_trainer_state(str(tmp_path / "run" / "checkpoint" / "step-000001"))
    assert state["data"]["sha256"] == checkpoint.data_fingerprint([Problem(t, "2") for t in texts[:5]])  # kept
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--steps", "2"]) == 0
    assert [r["step"] for r in checkpoint.read_metrics(str(tmp_path / "run" / "metrics.jsonl"))] == [1, 2]
