"""Cross-aggregation on the tiny policy: RSA over one policy's search traces with another policy's aggregator,
cached under keys naming both, resumable, equal to a policy's own RSA when both halves are that policy; and its
flags refused before anything loads."""

import copy
import json
import runpy
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import evaluate
import lora
import rollout
import tiny
import tracecache
from problemset import Problem

FLAGS = ["--preset", "tiny", "--method", "rsa", "--max-new-tokens", "8", "--rsa-populations", "3",
         "--rsa-set-size", "2", "--rsa-steps", "3"]


class CrossRuns:
    """main() on the tiny preset's warm start and two problems with two policies: base (the warm start) and lora (a
    random adapter on it that has its own aggregator); records each rollout.generate call's active LoRA adapter."""

    def __init__(self, root: Path, model, tokenizer):
        self.root, self.calls = root, []
        self.data = root / "problems.jsonl"
        self.data.write_text("".join(json.dumps({"problem": f"What is {a} + {a}?", "answer": str(2 * a)}) + "\n"
                                     for a in (1, 2)))
        adapted = copy.deepcopy(model)
        torch.manual_seed(0)  # lora.add_lora draws A from the global generator: the same adapter every run
        for name in ("default", "aggregator"):  # B != 0: not the base model exactly, still answering
            lora.add_lora(adapted, rank=2, alpha=2.0, adapter_name=name)
            with torch.no_grad():
                for p in lora.lora_parameters(adapted, name)[1::2]:
                    p.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
        self.adapter = root / "adapter"
        lora.save_adapter(adapted, self.adapter, tiny.WARM_START_DIR)
        lora.save_adapter(adapted, self.adapter / "aggregator", tiny.WARM_START_DIR, "aggregator")
        self.policies = ["--policy", f"base={tiny.WARM_START_DIR}", "--policy", f"lora={self.adapter}"]

    def __call__(self, *flags, cache="cache", code=0):
        self.calls = []
        out = self.root / f"{cache}.json"
        assert evaluate.main([*FLAGS, *self.policies, "--data", str(self.data), "--out", str(out),
                              "--cache-dir", str(self.root / cache), *flags]) == code
        return json.loads(out.read_text()) if code == 0 else None


@pytest.fixture(scope="module")
def cross_runs(tmp_path_factory):
    model, tokenizer = rollout.load_policy(tiny.WARM_START_DIR)
    runs = CrossRuns(tmp_path_factory.mktemp("cross"), model, tokenizer)
    generate = rollout.generate

    def recording_generate(m, tok, prompts, **kw):
        modules = lora.lora_modules(m)
        runs.calls.append((modules[0][1].active_adapter if modules else None, len(prompts) * kw["samples_per_prompt"]))
        return generate(m, tok, prompts, **kw)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model gains nothing from threads on a busy machine
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rollout, "load_policy", lambda name, dtype="auto": (copy.deepcopy(model), tokenizer))
        mp.setattr(rollout, "generate", recording_generate)
        yield runs
    torch.set_num_threads(threads)


def traces_by_adapter(calls) -> dict:
    """Traces generated under each active adapter (None: the base model). Counted in traces, not calls: a job whose
    prompts are all the same is sampled as copies of one prompt, in a call of its own."""
    return dict(Counter(adapter for adapter, traces in calls for _ in range(traces)))


# Each policy's own RSA on 2 problems: a pool of P = 3 search traces, then 3 aggregation traces at steps 2 and 3.
OWN = {None: 2 * 3 * 3, "policy:lora": 2 * 3, "aggregator:lora": 2 * 3 * 2}


def test_a_pair_of_a_policy_with_itself_is_its_own_rsa(cross_runs):
    """(A, A) draws nothing: its keys are A's own RSA keys, so its curve, set measures and traces are A's."""
    result = cross_runs("--cross", "lora=lora", "--cross", "base=base", cache="self")
    assert traces_by_adapter(cross_runs.calls) == OWN
    for pair in result["cross"]:
        own = result["policies"][pair["search"]]
        assert pair["search"] == pair["aggregator"]
        assert pair["summary"]["rsa"] == own["summary"]["rsa"]
        assert pair["summary"]["sets"]["rsa"] == own["summary"]["sets"]["rsa"]
        assert [p["rsa"] for p in pair["problems"]] == [p["rsa"] for p in own["problems"]]


def test_a_cross_pair_aggregates_the_searchers_traces_with_the_aggregators_adapter(cross_runs):
    """base -> lora: step 1 is base's search traces, step 2 aggregates the sets base's own RSA drew, with lora's
    aggregator adapter; its cache keys name base as the searcher; lora's own RSA keys do not."""
    result = cross_runs("--cross", "base=lora", cache="pair")
    assert traces_by_adapter(cross_runs.calls) == {**OWN, "aggregator:lora": OWN["aggregator:lora"] + 2 * 3 * 2}
    assert cross_runs.calls[-1][0] == "aggregator:lora"  # the pair's steps come last, with lora's aggregator
    (pair,) = result["cross"]
    base, tuned = result["policies"]["base"], result["policies"]["lora"]
    for crossed, own_search, own_agg in zip(pair["problems"], base["problems"], tuned["problems"]):
        steps, base_steps, lora_steps = crossed["rsa"]["3"], own_search["rsa"]["3"], own_agg["rsa"]["3"]
        assert steps[0] == base_steps[0]  # step 1: base's search traces
        assert steps[1]["sets"] == base_steps[1]["sets"]  # the very sets base aggregated
        assert steps[1]["samples"] != base_steps[1]["samples"] and steps[1]["samples"] != lora_steps[1]["samples"]
        assert any(s["answer"] for step in steps for s in step["samples"])  # answers, not empty traces: can fail
    curve = pair["summary"]["rsa"][0]
    assert curve["search_tokens"] == base["summary"]["rsa"][0]["search_tokens"]
    assert curve["tokens"] == pytest.approx([s + a for s, a in zip(curve["search_tokens"], curve["aggregation_tokens"])])
    keys = [json.loads(f.read_text())["key"] for f in (cross_runs.root / "pair").glob("*.json")]
    crossed = [k for k in keys if "search" in k]
    assert len(crossed) == 2 * 2  # steps 2 and 3 of two problems (one population)
    searcher, aggregator = base["policy"], tuned["policy"]
    assert all(k["search"] == {f: v for f, v in searcher.items() if f != "model"} for k in crossed)
    assert all(k["search_model"] == searcher["model"] and k["adapter"] == aggregator["adapter"] for k in crossed)

def test_a_cross_pair_resumes_from_the_cache_and_an_interrupted_one_finishes_as_a_cold_run(cross_runs, monkeypatch,
                                                                                          capsys):
    cold = cross_runs("--cross", "lora=base", cache="cold")
    again = cross_runs("--cross", "lora=base", cache="cold")
    assert cross_runs.calls == [] and again["cross"] == cold["cross"]  # the same command: nothing new, same numbers
    generate, lora_seen = rollout.generate, []

    def interrupted(model, *args, **kw):
        modules = lora.lora_modules(model)
        lora_seen.append(bool(modules) and modules[0][1].active_adapter is not None)
        if any(lora_seen) and not lora_seen[-1]:  # base's first call after lora's own RSA: the pair's step 2
            raise KeyboardInterrupt
        return generate(model, *args, **kw)

    monkeypatch.setattr(rollout, "generate", interrupted)
    cross_runs("--cross", "lora=base", cache="resumed", code=130)
    assert "interrupted" in capsys.readouterr().err
    monkeypatch.setattr(rollout, "generate", generate)
    resumed = cross_runs("--cross", "lora=base", cache="resumed")
    assert traces_by_adapter(cross_runs.calls) == {None: 2 * 3 * 2}  # only the pair's steps 2 and 3, by base
    assert resumed["cross"] == cold["cross"] and resumed["policies"] == cold["policies"]


class Numbered:
    """A stand-in Sampler: search trace j of every problem answers j; an aggregation trace at step t answers 10 t.
    Records the pool sizes asked for."""

    def __init__(self, name):
        self.identity, self.asked = {"model": name}, []

    def search(self, problems, count, max_new_tokens):
        self.asked.append(count)
        return [[tracecache.Trace(f"\\boxed{{{j}}}", 1, 1, False) for j in range(count)] for _ in problems]

    def aggregate(self, step, prompts_R, max_new_tokens, search_identity=None):
        return [[tracecache.Trace(f"\\boxed{{{10 * step}}}", 1, 1, False) for _ in prompts] for prompts in prompts_R]


def test_a_cross_pair_over_several_populations_reads_each_ones_first_p_search_traces():
    """RSA populations P = 2 and 4: the searcher's pool is drawn once, at the largest P, and each population's step
    1 is its first P traces (as the searcher's own RSA reads them), aggregated by the aggregator at steps >= 2."""
    cfg = SimpleNamespace(rsa_populations=[2, 4], rsa_set_size=2, rsa_steps=3, seed=0, max_new_tokens=8)
    problems = [Problem("What is 1 + 1?", "2", id="a"), Problem("What is 2 + 2?", "4", id="b")]
    searcher, aggregator = Numbered("A"), Numbered("B")
    records = evaluate.cross_aggregate(problems, searcher, aggregator, cfg)
    assert searcher.asked == [4] and aggregator.asked == []
    for record, problem in zip(records, problems):
        assert record["id"] == problem.id and sorted(record["rsa"]) == [2, 4]
        for P, steps in record["rsa"].items():
            assert [[s["answer"] for s in step["samples"]] for step in steps] == [
                [str(j) for j in range(P)], ["20"] * P, ["30"] * P]
            assert len(record["sets"]["rsa"][P]) == 2  # the sets of steps 2 and 3


def test_seeds_ignore_where_the_models_lie_but_not_whose_traces_were_aggregated():
    key = {"model": "/a/tiny", "adapter": "x", "stage": "rsa-step2", "search": {"adapter": "y"},
           "search_model": "/a/base"}
    moved = {**key, "model": "/b/tiny", "search_model": "/b/base"}
    assert tracecache.seed_of(key) == tracecache.seed_of(moved)
    assert tracecache.seed_of(key) != tracecache.seed_of({**key, "search": {"adapter": "z"}})


def test_cross_all_names_every_ordered_pair_once(tmp_path):
    cfg = evaluate.parse_args(["--preset", "tiny", "--policy", "a=tiny", "--policy", "b=tiny", "--policy", "c=tiny",
                               "--cross", "b=a", "--cross-all", "a,b", "--out", str(tmp_path / "r.json")])
    assert cfg.cross_pairs == [["b", "a"], ["a", "a"], ["a", "b"], ["b", "b"]]
    every = evaluate.parse_args(["--preset", "tiny", "--policy", "a=tiny", "--policy", "b=tiny", "--cross-all",
                                 "--out", str(tmp_path / "r.json")])
    assert every.cross_pairs == [["a", "a"], ["a", "b"], ["b", "a"], ["b", "b"]]
    assert evaluate.parse_args(["--preset", "tiny", "--out", str(tmp_path / "r.json")]).cross_pairs == []


@pytest.mark.parametrize("flags,message", [
    (["--cross", "nope=base"], "--cross nope=base: no policy is labelled 'nope' (the policies: base)"),
    (["--cross", "base=nope"], "no policy is labelled 'nope'"),
    (["--cross", "base"], "--cross base: expected SEARCH=AGGREGATOR"),
    (["--cross", "=base"], "expected SEARCH=AGGREGATOR"),
    (["--cross-all", "base,nope"], "--cross-all base,nope: no policy is labelled 'nope'"),
    (["--cross-all", "base,"], "no policy is labelled ''"),
    (["--cross", "base=base", "--rsa-steps", "1"], "needs --rsa-steps of at least 2"),
    (["--cross", "base=base", "--method", "passk", "--rsa-populations", "2"], "P=2 is smaller than the set size k=4"),
])
def test_bad_cross_flags_are_one_line_and_exit_code_2_before_loading(flags, message, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(rollout, "load_policy", lambda *a, **k: pytest.fail("loaded a model on bad input"))
    assert evaluate.main(["--preset", "tiny", "--out", str(tmp_path / "r.json"), *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("evaluate.py: error:") and message in err


def test_tracecache_run_as_a_script_prints_its_help_or_one_line(monkeypatch, capsys):
    path = str(Path(tracecache.__file__))
    for argv, code in [(["--help"], 0), ([], 2)]:
        monkeypatch.setattr(sys, "argv", [path, *argv])
        with pytest.raises(SystemExit) as exit_info:
            runpy.run_path(path, run_name="__main__")
        out, err = capsys.readouterr()
        assert exit_info.value.code == code
        assert ("evaluate.py's generation" in out and not err) if code == 0 else err.startswith("tracecache.py: error:")
