"""benchmarks/bench.py and its rows (bench_kit.py, bench_gpu.py, bench_cpu.py): each row's arithmetic checked against
the formula its docstring states, on a toy model on CPU with the device's floors fixed (no timed assertion); the
command line's plumbing with the rows replaced by recorders; the CPU log-prob benchmark at the real 151,936-token
vocabulary end to end (slow: CI's second command)."""

import ast
import dataclasses
import importlib.util
import json
import os
import pathlib
import sys
import time

import numpy as np
import pytest
import torch
from transformers import Qwen3Config

import fastgen
import lora
import rollout
import shared_prompt
import spiral
import train

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
FLOORS = {"copy_bandwidth_GBps": 20.0, "matmul_TFLOPs": 0.5, "matmul_dtype": "float32"}  # fixed: no timing involved
GB = 1e9


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench", BENCHMARKS / "bench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("bench", None)


@pytest.fixture(scope="module")
def rows(bench):
    """The row modules bench.py imported (bench_gpu, bench_cpu), to patch what they look up."""
    return sys.modules["bench_gpu"], sys.modules["bench_cpu"]


@pytest.fixture(scope="module")
def toy(bench):
    """run_gpu_part's model at --size toy: random Qwen3, LoRA r=32 on every projection, gradient checkpointing."""
    torch.manual_seed(0)
    model, tokenizer = bench.build_policy("toy", "cpu", torch.float32)
    lora.add_lora(model, rank=32, alpha=32.0)
    train.enable_gradient_checkpointing(model)
    return model, tokenizer


@pytest.fixture(scope="module")
def scale(bench):
    """The toy scale, shorter still; the paper's N1, n, K, N2 and GRPO's G = 12 kept (the budgets depend on them)."""
    return dataclasses.replace(bench.SCALES["toy"], problem_tokens=8, candidate_tokens=8, train_completion_tokens=8,
                               gen_prompts=2, gen_samples=2, gen_new_tokens=4, agg_prompts=2, agg_samples=2,
                               agg_new_tokens=3, step_new_tokens=3, grpo_new_tokens=6)


@pytest.fixture
def generate_calls(monkeypatch, toy):
    """Every rollout.generate call: its arguments, its completions and whether the LoRA adapter was active."""
    calls, real = [], rollout.generate
    model = toy[0]

    def spy(model_, tokenizer, prompts, **kwargs):
        adapter = lora.lora_modules(model)[0][1].active_adapter
        out = real(model_, tokenizer, prompts, **kwargs)
        calls.append({"prompts": list(prompts), "out": out, "adapter": adapter, **kwargs})
        return out

    monkeypatch.setattr(rollout, "generate", spy)
    return calls


def words(count: int) -> str:
    return " ".join(["w5"] * count)  # one token each: a prompt's length does not depend on which words


# ----------------------------------------------------------------------------------------------------------------------
# The counts and the kit


def test_flop_and_byte_counts_match_the_model(bench):
    model, _ = bench.build_policy("toy", "cpu", torch.float32)
    cfg = model.config
    linears = sum(m.weight.numel() for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear))
    assert bench.decoder_matmul_params(cfg) == linears
    distinct = {p.data_ptr(): p.numel() * 4 for p in model.parameters()}
    assert bench.weight_bytes(model) == sum(distinct.values())  # the tied embedding counted once
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    lora.add_lora(model, rank=4, alpha=4.0)
    assert bench.lora_params(model) == sum(4 * (m.base_layer.in_features + m.base_layer.out_features)
                                           for _, m in lora.lora_modules(model))  # A (r x in) and B (out x r)
    assert len(lora.lora_modules(model)) == 7 * cfg.num_hidden_layers  # every projection

    q4b = Qwen3Config(**bench.QWEN3_4B)
    assert bench.decoder_matmul_params(q4b) == 3_633_315_840  # 36 x 100,925,440
    assert bench.kv_bytes_per_token(q4b, 2) == 147_456  # rollout.py's 144 KiB per token
    # attention: causal pairs T(T+1)/2, QK^T and PV at 2 FLOPs per multiply-add each
    assert bench.attention_flops(q4b, 3) == 36 * 4 * 4096 * 6
    f = bench.train_step_flops(q4b, T=1000, completion_tokens=100, n_lora=0)
    N, A, head = 3_633_315_840, bench.attention_flops(q4b, 1000), 2 * 2560 * 151_936 * 100
    assert f["model_flops"] == 4 * N * 1000 + 3 * A + 2 * head  # frozen base: no weight gradients
    assert f["hardware_flops"] - f["model_flops"] == 2 * N * 1000 + A + head  # checkpointing's recompute
    assert f["attention_share"] == 3 * A / f["model_flops"]
    with_lora = bench.train_step_flops(q4b, T=1000, completion_tokens=100, n_lora=10)
    assert with_lora["model_flops"] - f["model_flops"] == 6 * 10 * 1000  # LoRA: forward, input and weight grads


def test_synthetic_tokenizer_round_trips_every_id(bench):
    tokenizer = bench.synthetic_tokenizer(151_936)
    ids = np.random.default_rng(0).integers(4, 151_936, 500).tolist()
    text = tokenizer.decode(ids, skip_special_tokens=True)
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == ids  # an aggregation prompt costs 1 token/token
    assert tokenizer.eos_token_id == 2 and tokenizer.pad_token_id == 0
    assert len(tokenizer(bench.random_words(37, 151_936, np.random.default_rng(1)))["input_ids"]) == 37
    small = bench.synthetic_tokenizer(8)  # random words are the non-special ids 4..7, each one token
    ids = small(bench.random_words(200, 8, np.random.default_rng(2)), add_special_tokens=False)["input_ids"]
    assert len(ids) == 200 and set(ids) == {4, 5, 6, 7}


def test_meter_sees_a_cpu_peak_freed_before_the_block_ends(bench):
    with bench.Meter("cpu") as meter:
        block = torch.ones(64 << 20)  # 256 MiB, touched
        del block  # freed: the resident set is back down when the block ends, its peak is not
    if meter.method != "VmHWM":
        pytest.skip("no /proc/self/clear_refs here: the CPU peak falls back to ru_maxrss")
    assert meter.peak_bytes - meter.start_bytes >= 0.95 * (256 << 20)
    assert meter.seconds > 0


def test_benchmark_modules_read_in_one_sitting_and_import_no_cycle():
    """bench.py imports its rows, the rows import bench_kit, bench_kit imports no benchmark module."""
    names = {p.stem for p in BENCHMARKS.glob("*.py")}
    graph = {}
    for path in BENCHMARKS.glob("*.py"):
        assert len(path.read_text().splitlines()) <= 600, path.name
        imports = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imports |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imports.add(node.module.split(".")[0])
        graph[path.stem] = imports & names - {path.stem}
    assert graph["bench_kit"] == set() and graph["bench_cpu"] == {"bench_kit"}
    assert graph["bench_gpu"] == {"bench_kit", "step_model"} and graph["step_model"] == graph["learner_cost"] == \
        {"bench_kit"}

    def reaches(start, target, seen):
        return any(n == target or (n not in seen and not seen.add(n) and reaches(n, target, seen))
                   for n in graph.get(start, ()))

    assert not [name for name in graph if reaches(name, name, set())]


# ----------------------------------------------------------------------------------------------------------------------
# GPU rows 1-4 on the toy model on CPU (bench_gpu.py)


def test_row1_train_step_counts_the_flops_of_the_aggregation_sample(bench, toy, scale, capsys):
    model, tokenizer = toy
    r = bench.measure_train_step(model, tokenizer, scale, "cpu", FLOORS)
    expected_prompt = rollout.chat_prompt_ids(tokenizer, rollout.aggregation_prompt(words(8), [words(8)] * 4))
    assert r["prompt_tokens"] == len(expected_prompt) and r["completion_tokens"] == 8
    flops = bench.train_step_flops(model.config, len(expected_prompt) + 8, 8, bench.lora_params(model))
    rate = FLOORS["matmul_TFLOPs"] * 1e12
    assert r["model_TFLOP"] == pytest.approx(flops["model_flops"] / 1e12)
    assert r["hardware_TFLOP"] == pytest.approx(flops["hardware_flops"] / 1e12)
    assert r["mfu"] == pytest.approx(flops["model_flops"] / r["seconds"] / rate)
    assert r["hfu"] == pytest.approx(flops["hardware_flops"] / r["seconds"] / rate)
    assert r["floor_seconds"] == pytest.approx(flops["model_flops"] / rate) and r["peak_memory_GB"] > 0
    # the model is left as sampling expects it: eval mode, no gradient carried into the next row
    assert not model.training and all(p.grad is None for p in lora.lora_parameters(model))
    bench.print_result("train", r)
    assert f"[1 train] {len(expected_prompt)} + 8 tokens" in capsys.readouterr().out


@pytest.mark.parametrize("adapter", [True, False])
def test_row2_generate_against_the_floor_the_docstring_states(bench, toy, scale, generate_calls, adapter, capsys):
    model, tokenizer = toy
    torch.manual_seed(0)
    r = bench.measure_generate(model, tokenizer, scale, "cpu", FLOORS, adapter=adapter)
    measured = generate_calls[-1]  # after one warm-up call
    assert len(generate_calls) == 2 and measured["micro_batch_size"] == 4 == r["batch"]
    assert measured["samples_per_prompt"] == 2 and measured["max_new_tokens"] == 4 and len(measured["prompts"]) == 2
    assert measured["adapter"] == ("default" if adapter else None) and r["lora_adapter_active"] == adapter
    completions = [c for row in measured["out"] for c in row]
    L, steps = max(len(c.prompt_ids) for c in completions), max(len(c.completion_ids) for c in completions)
    assert L == len(rollout.chat_prompt_ids(tokenizer, rollout.search_prompt(words(8))))
    assert (r["prompt_tokens"], r["decode_steps"]) == (L, steps) and steps >= 2
    assert r["tokens_generated"] == sum(len(c.completion_ids) for c in completions)
    # floor: steps - 1 decode steps, each reading every weight (LoRA's fp32 ones only when active) and every row's
    # cache (L + s tokens at step s), at the copy bandwidth; one prefill per prompt at the matmul rate
    cfg = model.config
    weights = bench.weight_bytes(model) - (0 if adapter else 4 * bench.lora_params(model))
    decode_bytes = (steps - 1) * weights + 4 * bench.kv_bytes_per_token(cfg, 4) * sum(L + s for s in range(1, steps))
    prefill = 2 * (2 * bench.decoder_matmul_params(cfg) * L + bench.attention_flops(cfg, L))
    floor_s = decode_bytes / (FLOORS["copy_bandwidth_GBps"] * GB) + prefill / (FLOORS["matmul_TFLOPs"] * 1e12)
    assert r["decode_GB_read"] == pytest.approx(decode_bytes / GB)
    assert r["fraction_of_floor"] == pytest.approx(floor_s / r["seconds"])
    assert r["tokens_per_s"] == pytest.approx(4 * steps / r["seconds"])
    assert r["floor_tokens_per_s"] == pytest.approx(4 * steps / floor_s)
    bench.print_result("generate", r)
    assert f"[2 generate] batch 4 x {steps} steps (prompt {L})" in capsys.readouterr().out


def test_row2_with_the_fast_engine_warms_up_at_the_measured_shape(bench, toy, scale, generate_calls, monkeypatch):
    """The fast engine compiles per call shape: the warm-up call is the measured call, not a small one."""
    model, tokenizer = toy
    shapes, real = [], fastgen.sample_micro_batch
    monkeypatch.setattr(fastgen, "sample_micro_batch", lambda *a, **k: shapes.append(
        (len(a[1]), a[2], a[3])) or real(*a, **k))  # (prompts, copies, max_new_tokens)
    monkeypatch.setattr(model, "generation_engine", "fast", raising=False)
    torch.manual_seed(0)
    r = bench.measure_generate(model, tokenizer, scale, "cpu", FLOORS)
    assert shapes == [(2, 2, 4), (2, 2, 4)] and r["batch"] == 4 and r["tokens_per_s"] > 0
    assert [c["prompts"] for c in generate_calls] == [generate_calls[1]["prompts"]] * 2


def test_row3_aggregation_runs_the_same_prompts_with_and_without_the_shared_prefix(bench, toy, scale, generate_calls,
                                                                                    capsys):
    model, tokenizer = toy
    torch.manual_seed(0)
    r = bench.measure_aggregation(model, tokenizer, scale, "cpu", FLOORS)
    warm_up, shared, unshared = generate_calls
    assert (shared["share_prefix"], unshared["share_prefix"]) == (True, False)
    assert shared["prompts"] == unshared["prompts"] and len(shared["prompts"]) == 2
    expected = len(rollout.chat_prompt_ids(tokenizer, rollout.aggregation_prompt(words(8), [words(8)] * 4)))
    assert r["prompt_tokens_mean"] == expected  # a problem and n = 4 full-length candidates, one token per word
    assert r["micro_batch_size"] == rollout.DEFAULT_TOKENS_PER_MICRO_BATCH // (expected + 3)
    for key, call in (("shared_prefix", shared), ("no_shared_prefix", unshared)):
        assert call["samples_per_prompt"] == 2 and call["max_new_tokens"] == 3
        assert r[key]["tokens_generated"] == sum(len(c.completion_ids) for row in call["out"] for c in row) > 0
    assert r["speedup_from_sharing"] == pytest.approx(r["no_shared_prefix"]["seconds"] / r["shared_prefix"]["seconds"])
    bench.print_result("aggregation", r)
    assert "[3 aggregation] 2 prompts x 2" in capsys.readouterr().out


def test_row4_splits_the_step_time_by_stage_and_grades_with_coin_flips(bench, toy, scale, monkeypatch, capsys):
    """A fake clock: each search call of spiral.generate takes 1e9 s, each aggregation call 1e6 s, each GRPO call
    1e3 s (N1 = 8, N2 = 4 and G = 12 samples per prompt tell them apart); the rest takes real time (< 1e3 s)."""
    model, tokenizer = toy
    real_clock, real_generate, real_reward = time.perf_counter, spiral.generate, spiral.reward
    offset = [0.0]
    stage_seconds = {8: 1e9, 4: 1e6, 12: 1e3}
    generated = []

    def slow_generate(*args, samples_per_prompt, **kwargs):
        out = real_generate(*args, samples_per_prompt=samples_per_prompt, **kwargs)
        offset[0] += stage_seconds[samples_per_prompt]
        generated.append(sum(len(c.completion_ids) for row in out for c in row))
        return out

    monkeypatch.setattr(time, "perf_counter", lambda: real_clock() + offset[0])
    monkeypatch.setattr(spiral, "generate", slow_generate)
    torch.manual_seed(0)
    r = bench.measure_spiral_step(model, tokenizer, scale, "cpu", FLOORS)
    s, g = r["spiral"], r["grpo"]
    assert spiral.generate is slow_generate and spiral.reward is real_reward  # both restored
    assert 1e9 <= s["search_s"] < 1e9 + 1e3 and 1e6 <= s["aggregation_s"] < 1e6 + 1e3
    assert 0 <= s["other_collection_s"] < 1e3 and 0 < s["training_s"] < 1e3
    assert s["total_s"] == pytest.approx(s["search_s"] + s["aggregation_s"] + s["other_collection_s"]
                                         + s["training_s"])
    assert 1e3 <= g["generate_s"] < 2e3 and g["total_s"] == pytest.approx(
        g["generate_s"] + g["other_collection_s"] + g["training_s"])
    assert r["time_ratio_spiral_over_grpo"] == pytest.approx(s["total_s"] / g["total_s"])
    assert s["token_budget"] == (8 + 4 * 4) * 3 and g["token_budget"] == 12 * 6
    assert s["tokens_generated"] == sum(generated[:2]) and g["tokens_generated"] == sum(generated[2:])
    # random weights never solve a problem: only the coin flips give signal, and every problem is kept
    assert s["samples_trained"] > 0 and g["samples_trained"] > 0
    bench.print_result("spiral", r)
    printed = capsys.readouterr().out
    assert "[4 spiral] 1 problem(s): search 1000000000." in printed and "[4 grpo]" in printed


def test_coin_flip_rewards_are_seeded_and_restore_the_grader(rows):
    bench_gpu = rows[0]
    real = spiral.reward
    with bench_gpu._coin_flip_rewards(seed=3):
        first = [spiral.reward("anything", "1") for _ in range(64)]
    with bench_gpu._coin_flip_rewards(seed=3):
        again = [spiral.reward("anything", "1") for _ in range(64)]
    assert first == again and set(first) == {0.0, 1.0} and spiral.reward is real


def test_the_gpu_part_passes_each_flag_to_its_row(bench, rows, monkeypatch, tmp_path, capsys):
    """--max-new-tokens (GRPO twice), --agg-prompts, --agg-micro-batch, --step-problems, --skip-grpo,
    --no-rollout-adapter and --engine reach the rows; the model is train.py's (LoRA r=32, checkpointing)."""
    bench_gpu = rows[0]
    seen = {}

    def recorder(key):
        def row(model, tokenizer, scale, device, floors, **kwargs):
            seen[key] = dict(scale=scale, kwargs=kwargs, engine=model.generation_engine, floors=floors,
                             lora=len(lora.adapter_names(model)), checkpointing=model.is_activation_checkpointing)
            return {"row": key}
        return row

    for key in bench_gpu.GPU_MEASUREMENTS:
        monkeypatch.setitem(bench_gpu.GPU_MEASUREMENTS, key, recorder(key))
    monkeypatch.setattr(bench_gpu, "print_result", lambda key, r: print(f"printed {key}"))
    out = tmp_path / "toy.json"
    assert bench.main(["--size", "toy", "--device", "cpu", "--only", "spiral,aggregation", "--max-new-tokens", "5",
                       "--agg-prompts", "3", "--agg-micro-batch", "6", "--step-problems", "2", "--skip-grpo",
                       "--no-rollout-adapter", "--engine", "fast", "--json", str(out)]) == 0
    assert list(seen) == ["spiral", "aggregation"]  # in --only's order
    scale = seen["spiral"]["scale"]
    assert (scale.gen_new_tokens, scale.agg_new_tokens, scale.step_new_tokens, scale.grpo_new_tokens) == (5, 5, 5, 10)
    assert (scale.agg_prompts, scale.step_problems, scale.problem_tokens) == (3, 2, bench.SCALES["toy"].problem_tokens)
    assert seen["spiral"]["kwargs"] == {"adapter": False, "grpo": False}
    assert seen["aggregation"]["kwargs"] == {"adapter": False, "micro_batch_size": 6}
    assert all(v["engine"] == "fast" and v["lora"] == 1 and v["checkpointing"] for v in seen.values())
    result = json.loads(out.read_text())
    assert result["written_by"] == "bench.py" and result["engine"] == "fast" and result["size"] == "toy"
    assert result["spiral"] == {"row": "spiral"} and result["floors"] == seen["spiral"]["floors"]
    assert result["floors"]["copy_bandwidth_GBps"] > 0 and result["floors"]["matmul_TFLOPs"] > 0
    assert result["scale"] == dataclasses.asdict(scale)
    assert capsys.readouterr().out.count("printed ") == 2
    assert bench.main(["--size", "toy", "--device", "cpu", "--only", "train,decode"]) == 2  # an unknown row
    assert "--only decode: choose from" in capsys.readouterr().err


def test_gpu_part_refuses_without_cuda(bench, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main([]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no CUDA GPU" in err and "--cpu" in err


def test_a_saved_random_model_trains_through_the_users_own_command(bench, tmp_path, capsys):
    """The 4B plan on a GPU: `bench.py --save-model DIR` (4B with random weights), then `python train.py --model
    DIR`. Here at toy size on CPU: the directory loads through train.py's own path and a SPIRAL step runs."""
    model_dir = tmp_path / "toy-model"
    assert bench.main(["--size", "toy", "--device", "cpu", "--save-model", str(model_dir)]) == 0
    assert bench.main(["--size", "toy", "--device", "cpu", "--save-model", str(model_dir)]) == 2  # never overwrites
    out = tmp_path / "run"
    assert train.main(["--model", str(model_dir), "--device", "cpu", "--out", str(out), "--data", "tiny_sums",
                       "--steps", "1", "--batch-problems", "1", "--max-draws", "1", "--max-new-tokens", "4",
                       "--no-plot"]) == 0
    row = json.loads((out / "metrics.jsonl").read_text())
    assert row["problems_drawn"] == 1 and row["tokens_generated"] == (8 + 4 * 4) * 4  # random weights never stop
    assert row["aggregation_accuracy"] == 0.0  # nor answer: every reward is 0, so nothing is kept to train on
    assert (out / "adapter" / "adapter_config.json").is_file()


# ----------------------------------------------------------------------------------------------------------------------
# CPU rows 5 and 7 (bench_cpu.py)


def test_row5_naive_and_chunked_log_probs_agree_forward_and_backward(bench, rows, monkeypatch, capsys):
    """run_cpu_part with each worker run in this process at a 2,048-token vocabulary and temperature 0.7 (the
    subprocess and the real vocabulary: the slow test below): the two paths give the same log-probs and LoRA
    gradients, a difference planted in one path's output is reported, and the ratios are the measured peaks' and
    times'."""
    bench_cpu = rows[1]
    specs = []

    def in_process(spec):
        spec = {**spec, "vocab_size": 2048, "hidden_size": 64, "temperature": 0.7}
        specs.append(spec)
        result = bench_cpu.logprob_worker(spec)
        if spec.get("chunk_size") == 64:  # a planted error the comparison must report: 0.5 on one log-prob,
            saved = torch.load(spec["out"])  # 1.5 x one gradient
            saved["logprobs"][3] += 0.5
            saved["grads"][0] *= 1.5
            torch.save(saved, spec["out"])
        return result

    monkeypatch.setattr(bench_cpu, "_run_worker", in_process)
    args = bench.build_parser().parse_args(["--cpu", "--small", "--chunk-sizes", "128,64"])
    r = bench.run_cpu_part(args)
    assert [s["path"] for s in specs] == ["naive", "chunked", "chunked"] and r["completion_tokens"] == 512
    naive, (c128, c64) = r["naive"], r["chunked"]
    assert (c128["chunk_size"], c64["chunk_size"], r["logprob_chunk_size"]) == (128, 64, 128)
    assert c128["max_abs_logprob_diff"] < 1e-5 and c128["max_rel_grad_diff"] < 1e-4
    assert c64["max_abs_logprob_diff"] == pytest.approx(0.5, abs=1e-5)
    assert c64["max_rel_grad_diff"] == pytest.approx(0.5, abs=1e-4)
    for c in (c128, c64):
        assert c["memory_ratio"] == pytest.approx(naive["peak_bytes"] / c["peak_bytes"])
        assert c["time_ratio"] == pytest.approx(c["seconds"] / naive["seconds"])
    assert r["logprob_memory_ratio"] == c128["memory_ratio"] and r["logprob_time_ratio"] == c128["time_ratio"]
    assert capsys.readouterr().out.count("[5 logprobs] chunked") == 2


@pytest.mark.slow
def test_cpu_benchmark_small_writes_json_with_chunked_equal_to_naive_and_less_memory(bench, tmp_path):
    out = tmp_path / "cpu.json"
    assert bench.main(["--cpu", "--small", "--json", str(out)]) == 0  # each path runs in its own subprocess
    r = json.loads(out.read_text())
    chunked = r["chunked"][0]
    assert r["vocab_size"] == 151_936 and r["completion_tokens"] == 512 and chunked["chunk_size"] == 128
    # Same numbers: the chunked path is the naive formula, forward and backward.
    assert chunked["max_abs_logprob_diff"] < 1e-4
    assert chunked["max_rel_grad_diff"] < 1e-3
    # 4 chunks of 128 against one (544 x V) fp32 tensor: clearly less memory (measured ~2.4x; 1.0 if not chunked).
    assert r["logprob_memory_ratio"] == pytest.approx(r["naive"]["peak_bytes"] / chunked["peak_bytes"])
    assert r["logprob_memory_ratio"] > 1.5
    assert r["naive"]["peak_bytes"] > 544 * 151_936 * 4  # at least the full fp32 logits
    assert r["logprob_time_ratio"] > 0
    learner = r["learner"]  # row 9: the same gradient, fewer tokens through the model
    assert learner["max_rel_grad_diff"] < 1e-4 and learner["time_ratio_per_sample_over_grouped"] > 0
    assert learner["tokens_through_the_model"]["grouped"] < learner["tokens_through_the_model"]["per-sample"]
    assert learner["groups"] < learner["samples_trained"]


def test_copy_counter_counts_written_bytes_by_category(bench):
    """cat: its output; a view: nothing; index_copy_ into a big tensor: the source only; a boolean result: a mask;
    a matmul: not a copy."""
    big, row = torch.zeros(8, 100), torch.ones(8, 1)
    with bench.CopyCounter() as counter:
        torch.cat([big, big], dim=1)  # 8 x 200 x 4 bytes
        big[:, :50].unsqueeze(0)  # views
        big.index_copy_(1, torch.tensor([3]), row)  # 8 x 4 bytes
        big > 0  # 800 bytes of mask
        big @ big.T  # compute
        big.t().contiguous()  # a copy: 3,200 bytes
    assert counter.bytes == {"concatenation": 6400, "necessary": 32, "mask": 800, "copy": 3200}


def test_row7_the_references_copies_grow_with_the_cache_and_the_fast_paths_do_not(bench, toy, one_thread):
    """measure_decode at two prompt lengths (4 rows, 2 steps): Hugging Face's DynamicCache is re-concatenated every
    step, so its bytes copied per step grow with the cache; fastgen writes the new token's K and V in place, so
    its copies per step stay flat, and what it writes as necessary is that K and V plus the token's record."""
    model, tokenizer = toy
    kv = bench.kv_bytes_per_token(model.config, 4)
    prompts = {n: [rollout.search_prompt(words(n)), rollout.search_prompt(words(n))] for n in (4, 404)}
    r = {(engine, n): bench.measure_decode(model, tokenizer, prompts[n], 2, 2, 1, engine)
         for engine in ("hf", "fast") for n in prompts}
    cache_growth = 4 * kv * 400  # 4 rows, 400 more prompt tokens each
    hf = r["hf", 404]["bytes_per_step_by_category"]["concatenation"] - r["hf", 4]["bytes_per_step_by_category"][
        "concatenation"]
    assert hf > 0.9 * cache_growth
    fast = r["fast", 404]["bytes_copied_per_step"] - r["fast", 4]["bytes_copied_per_step"]
    assert abs(fast) < 0.02 * cache_growth
    for n in prompts:
        written = r["fast", n]["bytes_per_step_by_op"]["necessary:index_copy_"]
        assert 4 * kv <= written <= 4 * kv + 4 * 32  # K, V of 4 rows; token, log-prob, entropy per row
        assert r["fast", n]["engine"] == "fast" and r["hf", n]["ms_per_step"] == pytest.approx(
            1000 * (r["hf", n]["seconds_3_tokens"] - r["hf", n]["seconds_1_token"]) / 2)


def test_row7_decode_part_from_the_command_line(bench, rows, toy, monkeypatch, tmp_path, capsys, one_thread):
    """--cpu --cpu-parts decode --small: both engines, batch 64 (8 prompts x 8), LoRA active, written to --json;
    the tiny policy replaced by the toy model (the same code path, smaller)."""
    import tiny

    built = []

    def toy_policy(device):
        torch.manual_seed(0)
        built.append(bench.build_policy("toy", device, torch.float32))
        return built[-1]

    monkeypatch.setattr(tiny, "load_tiny_policy", toy_policy)
    out = tmp_path / "decode.json"
    assert bench.main(["--cpu", "--cpu-parts", "decode", "--small", "--json", str(out)]) == 0
    assert capsys.readouterr().out.count("[7 decode]") == 2
    r = json.loads(out.read_text())["decode"]
    assert (r["batch"], r["decode_steps"], r["repeats"]) == (64, 8, 1)
    model, tokenizer = toy
    longest = max(len(rollout.chat_prompt_ids(tokenizer, rollout.search_prompt(p.problem)))
                  for p in tiny.tiny_sum_problems()[:8])
    assert r["kv_cache_bytes_read_last_step"] == 64 * bench.kv_bytes_per_token(model.config, 4) * (longest + 8)
    assert r["hf"]["engine"] == "hf" and r["fast"]["engine"] == "fast"
    assert lora.adapter_names(built[0][0]) == ["default"]  # sampled as train.py samples: LoRA r=32 active
    assert r["hf"]["bytes_copied_per_step"] > r["fast"]["bytes_copied_per_step"] > 0
    assert bench.main(["--cpu", "--cpu-parts", "decoding"]) == 2
    assert "--cpu-parts decoding: choose from logprobs,decode" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------------------------------
# The learner: the GPU rows on the toy model, the step model, the meta-device count


def test_learner_rows_run_every_variant_and_count_the_group_s_flops(bench, rows, toy, scale, capsys):
    model, tokenizer = toy
    result = rows[0].measure_learner(model, tokenizer, scale, "cpu", FLOORS, size="toy")
    P, L, N2 = result["prompt_tokens"], result["completion_tokens"], result["completions"]
    n_lora = bench.lora_params(model)
    for learner in ("grouped", "per-sample"):
        for variant in ("flash", "flash_keep", "cudnn", "cudnn_keep"):
            r = result[f"{learner}_{variant}"]
            flops = (bench.grouped_step_flops(model.config, P, [L] * N2, n_lora) if learner == "grouped"
                     else bench.train_step_flops(model.config, P + L, L, n_lora))  # one of the group's samples
            assert r["completions_trained"] == (N2 if learner == "grouped" else 1)
            assert r["model_TFLOP"] == pytest.approx(flops["model_flops"] / 1e12)
            assert r["mfu"] == pytest.approx(flops["model_flops"] / r["seconds"] / 0.5e12)
            assert "model_seconds" not in r  # the step model describes the 4B on an H100, not the toy
    assert model.is_activation_checkpointing and lora.lora_parameters(model)[0].requires_grad
    assert capsys.readouterr().out.count("[learner ") == 8


def test_a_learner_row_labelled_grouped_refuses_a_per_sample_measurement(bench, rows, toy, scale, monkeypatch,
                                                                          capsys):
    """Where the grouped learner does not apply, train.accumulate_gradients trains per sample: the grouped rows say
    so as errors (and bench.py's exit status counts them), the per-sample rows are measured."""
    model, tokenizer = toy
    monkeypatch.setattr(shared_prompt, "unsupported", lambda model: "its layers are ['sliding_attention']")
    result = rows[0].measure_learner(model, tokenizer, scale, "cpu", FLOORS, size="toy")
    for variant in ("flash", "flash_keep", "cudnn", "cudnn_keep"):
        assert result[f"grouped_{variant}"] == {
            "error": "the grouped learner did not run (per-sample: its layers are ['sliding_attention'])"}
        assert result[f"per-sample_{variant}"]["seconds"] > 0
    assert bench.failed_measurements({"learner": result}) == [
        f"learner grouped_{v}: the grouped learner did not run (per-sample: its layers are ['sliding_attention'])"
        for v in ("flash", "flash_keep", "cudnn", "cudnn_keep")]
    assert capsys.readouterr().out.count("error: the grouped learner did not run") == 4


def test_a_failed_gpu_row_makes_bench_py_exit_1_naming_it(bench, rows, monkeypatch, tmp_path, capsys):
    bench_gpu = rows[0]
    monkeypatch.setitem(bench_gpu.GPU_MEASUREMENTS, "train", lambda *a, **k: {"seconds": 1.0})
    monkeypatch.setitem(bench_gpu.GPU_MEASUREMENTS, "train_py", lambda *a, **k: {"error": "train.main exited 2"})
    monkeypatch.setattr(bench_gpu, "print_result", lambda key, r: None)
    out = tmp_path / "rows.json"
    assert bench.main(["--size", "toy", "--device", "cpu", "--only", "train,train_py", "--json", str(out)]) == 1
    err = capsys.readouterr().err
    assert err == "bench.py: error: 1 measurement(s) failed: train_py: train.main exited 2\n"
    assert json.loads(out.read_text())["train"] == {"seconds": 1.0}  # what was measured is kept
    assert bench.main(["--size", "toy", "--device", "cpu", "--only", "train"]) == 0


def test_the_train_py_step_needs_no_math_grader_and_refuses_a_per_sample_learner(bench, rows, scale, monkeypatch, capsys):
    """The GPU machine has no math-verify unless its wheels are carried: the train.py step grades with coin flips
    through train.py's own --reward, so neither the grader's start-up check nor the grader ever runs."""
    import reward

    def no_grader(*args, **kwargs):
        raise AssertionError("the math grader was asked")

    monkeypatch.setattr(reward, "check_grader", lambda: "No module named 'math_verify'")
    monkeypatch.setattr(spiral, "reward", no_grader)
    torch.manual_seed(0)
    model, tokenizer = bench.build_policy("toy", "cpu", torch.float32)  # the row hands train.py the bare model
    r = rows[0].measure_train_py_step(model, tokenizer, scale, "cpu", FLOORS, size="toy")
    assert "error" not in r, r
    assert r["samples_trained"] > 0  # coin flips: some rewards 1, some 0, so the problem is kept and trained
    assert rows[0].coin_flip_reward(None, "a text") == rows[0].coin_flip_reward(None, "a text") in (0.0, 1.0)
    assert {rows[0].coin_flip_reward(None, f"text {i}") for i in range(16)} == {0.0, 1.0}
    monkeypatch.setattr(shared_prompt, "unsupported", lambda model: "its layers are ['sliding_attention']")
    r = rows[0].measure_train_py_step(model, tokenizer, scale, "cpu", FLOORS, size="toy")  # labelled grouped
    assert r["error"] == "the grouped learner did not run (per-sample: its layers are ['sliding_attention'])"


def _benchmark(name):
    """benchmarks/NAME.py as a module (registered: its dataclasses look their module up)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def test_the_step_model_reproduces_what_it_was_fitted_on_and_predicts_the_rest():
    """Fitted to the H100 session's files: row 1 with flash and cuDNN (3.79 s, 2.99 s) come back exactly; the
    search calls it was not fitted on within 5 %; a SPIRAL step at train.py's defaults: 13 + 13 + 6 aggregation
    prompts per call, the learner's FLOPs as bench_kit counts them with the LoRA count of the model itself, the
    grouped learner about half of them."""
    sm = _benchmark("step_model")
    f = sm.fit()
    assert sm.lora_count() == 66_060_288  # r = 32 on 7 projections x 36 layers, counted on the meta-device model
    row = sm.train_step_flops(sm.CONFIG, 17_596 + 4096, 4096, sm.lora_count())
    assert sm.predict_learner([row], "flash") == pytest.approx(3.7934, rel=1e-3)
    assert sm.predict_learner([row], "cudnn") == pytest.approx(2.9868, rel=1e-3)
    assert sm.predict_learner([row], "cudnn", keep_attention_outputs=True) < sm.predict_learner([row], "cudnn")
    checks = {name: (measured, model) for name, measured, model in sm.check(f)}
    for name in ("search_512", "search_4096"):
        measured, model = checks[name]
        assert abs(model / measured - 1) < 0.05, name
    s = sm.spiral_step(f)
    assert s["aggregation_calls"] == [13, 13, 6]
    assert s["learner_PFLOP_per_sample"] == pytest.approx(102.35, abs=0.01)  # (8 + 16) samples x 8 problems
    assert s["learner_PFLOP_grouped"] == pytest.approx(49.92, abs=0.01)
    assert s["learner_grouped_s"] < 0.55 * s["learner_per_sample_s"]
    assert s["step_s"] == pytest.approx(s["search_s"] + s["aggregation_s"] + s["learner_per_sample_s"])
    assert s["roofline_generation_s"] < s["search_s"] + s["aggregation_s"]
    g = sm.grpo_step(f)
    assert g["calls"] == [4, 4] and g["learner_PFLOP_per_sample"] == pytest.approx(21.7, abs=0.1)


def test_the_step_model_runs_each_attention_segment_on_the_kernel_the_code_runs_it_with():
    """With --learner-attention cudnn a per-sample row and a grouped prompt run cuDNN, a grouped completion flash
    (shared_prompt.lower_right_causal_attention): so GRPO's groups (a 1k prompt, 12 x 8,192-token completions) train
    slower grouped than per sample with cuDNN, and a SPIRAL step with cuDNN is ~762 s, not 724 s."""
    sm = _benchmark("step_model")
    f = sm.fit()
    group = sm.grouped_step_flops(sm.CONFIG, 17_596, [4096] * 4, sm.lora_count())
    prompt_only = sm.grouped_step_flops(sm.CONFIG, 17_596, [], sm.lora_count())
    assert group["attention_flops"] - group["flash_attention_flops"] == prompt_only["attention_flops"]
    everything_cudnn = dict(group, flash_attention_flops=0)
    assert f.micro_step_s(group, "cudnn") > f.micro_step_s(everything_cudnn, "cudnn")
    assert f.micro_step_s(group, "flash") == pytest.approx(f.micro_step_s(everything_cudnn, "flash"))
    g = sm.grpo_step(f, kernel="cudnn")
    assert g["learner_grouped_s"] > g["learner_per_sample_s"]
    s = sm.spiral_step(f, kernel="cudnn")
    assert s["step_grouped_s"] == pytest.approx(762, abs=1)
    assert sm.aggregation_prompt(2048) == 17_596 - 4 * 2048
    levers = sm.levers(f)
    assert sorted(levers, key=levers.get, reverse=True)[:3] == ["decode fixed cost", "learner attention", "prefill"]
    assert [round(levers[k]) for k in ("decode fixed cost", "learner attention", "prefill")] == [152, 131, 55]  # README
    assert levers["completions on cuDNN"] == pytest.approx(s["step_grouped_s"] - 724, abs=1)


def test_the_meta_device_count_of_a_grouped_micro_batch_equals_the_formula():
    """The real grouped learner at Qwen3-4B's shape on the meta device: its matmul and attention FLOPs are
    grouped_step_flops' (the entropy's dot products apart), no attention call gets a mask or repeated K/V, and
    keeping attention outputs costs memory and saves the recomputation."""
    lc = _benchmark("learner_cost")
    group = lc._samples(200, 2, "aggregation")
    for s in group:
        s.completion_ids, s.sampler_logprobs = s.completion_ids[:48], s.sampler_logprobs[:48]
    real = lc.logprobs.checkpoint
    lc.logprobs.checkpoint = lambda function, *args, use_reentrant: function(*args)
    try:
        model = lc.build(checkpointing=False)
        cost = lc.train_parts(model, [group])
    finally:
        lc.logprobs.checkpoint = real
    c, T = model.config, 200 + 96
    formula = lc.grouped_step_flops(c, 200, [48, 48], lc.lora_params(model))["model_flops"]
    entropy = 2 * c.vocab_size * 96  # the (detached) entropy's dot product per completion token
    # the formula's one overcount: layer 0's q, k, v (base and LoRA A) get no input gradient (the embeddings need none)
    qkv = c.num_attention_heads * c.head_dim + 2 * c.num_key_value_heads * c.head_dim
    layer0 = 2 * T * c.hidden_size * qkv + 2 * T * 32 * c.hidden_size * 3
    assert cost.flops == formula + entropy - layer0
    assert cost.masked_calls == cost.repeated_kv_calls == 0 and cost.attention_calls == 36 * 3
    costs = {keep: lc.train_parts(lc.build(checkpointing=True, keep_attention_outputs=keep), [group])
             for keep in (False, True)}
    assert costs[True].attention_calls == 36 * 3 and costs[False].attention_calls == 2 * 36 * 3
    assert costs[True].peak > costs[False].peak
