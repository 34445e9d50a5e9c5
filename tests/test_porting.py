"""What a porter and a user moving a run rely on: a tiny run directory carries its base and still loads after a move;
M of Proposition 3.1 is logged; --unbiased-set-rl divides exactly the search-trace advantages by M.

The tiny run uses the tiny preset's warm start (copied into OUT/base) with a pseudo-random reward, as
test_checkpoint.py does, so that advantages are non-zero and the adapter really moves."""

import json
import os
import shutil
import zlib

import numpy as np
import pytest
import torch

import evaluate
import lora
import setsample
import spiral
import train
from problemset import Problem
from test_spiral import fake_reward, scripted_generate

SMALL = ["--preset", "tiny", "--batch-problems", "1", "--num-search", "3", "--set-size", "2", "--num-sets", "2",
         "--num-aggregations", "2", "--max-new-tokens", "6", "--no-plot"]


def _logits(base_dir, adapter_dir):
    """Logits of base + adapters loaded from disk (the aggregator too, if there is one) on fixed ids."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir).eval()
    lora.load_adapter(model, adapter_dir)
    lora.load_adapter(model, os.path.join(adapter_dir, "aggregator"), "aggregator")
    ids = torch.randint(3, 200, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model(ids).logits, lora.use_adapter(model, "aggregator").__enter__()(ids).logits


@pytest.fixture(scope="module")
def moved_run(tmp_path_factory):
    """A one-step tiny SPIRAL run with both adapters, trained in one place, then moved two levels deeper."""
    old, new = tmp_path_factory.mktemp("a") / "run", tmp_path_factory.mktemp("b") / "x" / "y" / "run"
    patch = pytest.MonkeyPatch()
    patch.setattr(spiral, "reward", lambda text, gold: float(zlib.crc32(text.encode()) % 2))
    try:
        assert train.main(SMALL + ["--separate-aggregator", "--steps", "1", "--out", str(old)]) == 0
    finally:
        patch.undo()
    before = _logits(lora.resolve_base_path(str(old / "adapter")), str(old / "adapter"))
    os.makedirs(new.parent)
    shutil.move(str(old), str(new))
    return new, before


def test_a_moved_tiny_run_loads_its_adapters_and_base(moved_run):
    run, before = moved_run
    adapter = str(run / "adapter")
    assert lora.read_adapter_config(adapter)["base_model_name_or_path"] == "../base"
    assert lora.read_adapter_config(os.path.join(adapter, "aggregator"))["base_model_name_or_path"] == "../../base"
    assert lora.resolve_base_path(adapter) == str(run / "base")
    assert lora.resolve_base_path(os.path.join(adapter, "aggregator")) == str(run / "base")
    assert json.loads((run / "base" / "warm_start.json").read_text())  # the warm start, copied whole
    after = _logits(lora.resolve_base_path(adapter), adapter)
    assert all(torch.equal(a, b) for a, b in zip(after, before))
    with torch.no_grad():  # and the adapters matter: without them the base gives other logits
        from transformers import AutoModelForCausalLM
        plain = AutoModelForCausalLM.from_pretrained(run / "base").eval()(
            torch.randint(3, 200, (2, 9), generator=torch.Generator().manual_seed(0))).logits
    assert not torch.equal(plain, after[0]) and not torch.equal(plain, after[1])
    # evaluate.py finds the base through the adapter, wherever the run now lies.
    policies = evaluate.parse_args(["--preset", "tiny", "--adapter", adapter]).policies
    assert [p["model"] for p in policies if p["adapter"]] == [str(run / "base")]


def test_real_peft_loads_the_moved_adapter_given_the_resolved_base(moved_run, monkeypatch):
    """Runs only where peft is installed. peft resolves "../base" against the working directory, so a porter
    passes the base explicitly; from the adapter directory itself AutoPeftModelForCausalLM works as well."""
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    run, before = moved_run
    adapter = str(run / "adapter")
    model = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(lora.resolve_base_path(adapter)),
                                           adapter).eval()
    ids = torch.randint(3, 200, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before[0])
    monkeypatch.chdir(adapter)
    with torch.no_grad():
        assert torch.equal(peft.AutoPeftModelForCausalLM.from_pretrained(".").eval()(ids).logits, before[0])


def test_M_is_logged_in_config_json_and_every_step(moved_run):
    run, _ = moved_run
    M = setsample.gradient_scale(3, 2, 2)  # N1 = 3, n = 2, K = 2: q_K = 1, M = 3/2 - 1
    assert M == 0.5
    config = json.loads((run / "config.json").read_text())
    assert config["gradient_scale_M"] == M and config["unbiased_set_rl"] is False
    (row,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert row["gradient_scale_M"] == M and row["search_advantage_scale"] == 1.0  # the paper: M is not applied


def test_grpo_logs_no_M():
    cfg = train.resolve_config({"preset": "tiny", "algo": "grpo"})
    assert train.gradient_scale_M(cfg) is None


def _collect(scale):
    good = {"p0": {0, 1, 2}, "p1": {5}}
    generate, _ = scripted_generate(good)
    patch = pytest.MonkeyPatch()
    patch.setattr(spiral, "generate", generate)
    patch.setattr(spiral, "reward", fake_reward)
    queue = [Problem(problem=name, answer="1") for name in ["p0", "p1"]]
    try:
        return spiral.collect_spiral(None, None, lambda: queue.pop(0), batch_problems=2, rng=np.random.default_rng(3),
                                     search_advantage_scale=scale)
    finally:
        patch.undo()


def test_search_advantage_scale_divides_exactly_the_search_advantages():
    M = setsample.gradient_scale(8, 4, 4)
    assert M == pytest.approx(1365 / 1541)
    paper, unbiased = _collect(1.0), _collect(1 / M)
    assert [s.role for s in paper.samples] == [s.role for s in unbiased.samples]
    search = [(a.advantage, b.advantage) for a, b in zip(paper.samples, unbiased.samples) if a.role == "search"]
    assert any(a != 0 for a, _ in search)
    assert all(b == pytest.approx(a / M, abs=0) for a, b in search)
    assert all(a.advantage == b.advantage for a, b in zip(paper.samples, unbiased.samples) if a.role != "search")
    assert unbiased.metrics["gradient_scale_M"] == M and unbiased.metrics["search_advantage_scale"] == 1 / M


def test_the_flag_passes_1_over_M_to_the_collector(monkeypatch):
    seen = {}
    monkeypatch.setattr(spiral, "collect_spiral", lambda *args, **kwargs: seen.update(kwargs))
    for flag, expected in [(False, 1.0), (True, 1 / setsample.gradient_scale(8, 4, 4))]:
        cfg = train.resolve_config({"preset": "tiny", "unbiased_set_rl": flag})
        train.collect(cfg, None, None, None, np.random.default_rng(0))
        assert seen["search_advantage_scale"] == expected


@pytest.mark.parametrize("argv, message", [
    (["--num-sets", "1"], "--unbiased-set-rl: M = 0 for --num-sets 1 (K = 1 or N1 = n"),
    (["--num-search", "2", "--set-size", "2", "--num-sets", "1"], "--unbiased-set-rl: M = 0 for --num-sets 1"),
    (["--algo", "grpo"], "--unbiased-set-rl needs --algo spiral"),
])
def test_unbiased_set_rl_without_an_M_is_a_one_line_error(argv, message, tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main(SMALL[:2] + argv + ["--unbiased-set-rl", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("train.py: error: ") and message in err and err.count("\n") == 1
    assert not out.exists()


def test_trl_spiral_without_trl_is_a_one_line_error(monkeypatch, capsys):
    """Runs everywhere: the main environment has no trl; elsewhere its absence is simulated."""
    import trl_spiral

    monkeypatch.setattr(trl_spiral, "MISSING", ImportError("No module named 'trl'"))
    assert trl_spiral.main(["--preset", "tiny"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trl_spiral.py: error: needs trl and peft") and "trl==1.16.0" in err and err.count("\n") == 1
