"""PORTING.md's code runs: every fenced block is executed, in order, in one namespace. A block whose first line says
`# needs trl|peft|verl` runs where that package imports and is skipped elsewhere; .ci/engines runs this file in an
environment with trl and peft and in one with verl, and names them in SPIRAL_ENGINES, so that a block needing a
package named there must run. A block whose first line says `# not run: ...` is only parsed. The guide pins the
versions it was checked against, and names what the code has."""

import ast
import importlib.metadata
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

import advantages
import logprobs
import lora
import train

ROOT = pathlib.Path(__file__).resolve().parents[1]
GUIDE = (ROOT / "PORTING.md").read_text()
BLOCKS = re.findall(r"^```(\w*)\n(.*?)^```$", GUIDE, flags=re.S | re.M)
NEEDS = re.compile(r"# needs (trl|peft|verl)\n")
NOT_RUN = re.compile(r"# not run: \S")
PINNED = {"trl": "1.16.0", "peft": "0.21.2", "verl": "0.9.1"}
ENGINES = set(os.environ.get("SPIRAL_ENGINES", "").split())  # what .ci/engines installed in this environment


def runs_here(code):
    needs = NEEDS.match(code)
    return not NOT_RUN.match(code) and (needs is None or importlib.util.find_spec(needs.group(1)) is not None)


def test_every_block_is_python_and_either_runs_or_says_what_it_needs():
    assert len(BLOCKS) >= 8
    for language, code in BLOCKS:
        assert language == "python", f"a ```{language} block: the test cannot run it"
        ast.parse(code)  # even a block that is not run must be valid Python
        first = code.splitlines()[0]
        assert not first.startswith("# ") or NEEDS.match(code) or NOT_RUN.match(code), first
    not_run = [code for _, code in BLOCKS if NOT_RUN.match(code)]
    assert len(not_run) == 1  # vLLM serving (a GPU): nothing else is exempt (the verl recipe runs in CI)


@pytest.fixture
def tiny_run(tmp_path, monkeypatch):
    """The peft block loads runs/tiny-spiral/adapter: a one-step tiny run there, in a scratch directory."""
    monkeypatch.chdir(tmp_path)
    if any(NEEDS.match(code) and code.startswith("# needs peft") and runs_here(code) for _, code in BLOCKS):
        assert train.main(["--preset", "tiny", "--batch-problems", "1", "--num-search", "3", "--set-size", "2",
                           "--num-sets", "2", "--num-aggregations", "2", "--max-new-tokens", "6", "--steps", "1",
                           "--no-plot", "--out", "runs/tiny-spiral"]) == 0


def test_the_blocks_run_in_order(tiny_run, one_thread):
    runnable = [code for _, code in BLOCKS if runs_here(code)]
    assert len(runnable) >= 4
    namespace = {"__name__": "porting_guide"}
    for number, code in enumerate(runnable):
        exec(compile(code, f"PORTING.md runnable block {number}", "exec"), namespace)
    assert namespace["adv_BT"].shape == (2 * (4 + 2 * 2), 6)
    assert namespace["adv_S"].shape == (8 + 4 * 4,) and namespace["adv_S"].dtype == torch.float32  # one prompt
    assert namespace["adv_BT"].abs().max() > 0  # the example has signal
    for name in ENGINES:  # in CI's engines environments, every block needing what they installed ran
        assert importlib.util.find_spec(name) is not None, f"SPIRAL_ENGINES names {name}, which is not installed"
        assert any(code.startswith(f"# needs {name}\n") for code in runnable)
    if "verl" in ENGINES:
        assert namespace["data"].batch["advantages"].abs().max() > 0  # verl's DataProto, section 4


STANDALONE = ["setsample.py", "prompts.py", "advantages.py"]  # "copy this file into another trainer as it is"


def test_what_to_copy_lists_the_standalone_files_and_the_guide_cites_the_prompts_where_they_live():
    table = GUIDE[GUIDE.index("## 1. What to copy"):GUIDE.index("## 2. ")]
    assert all(f"| `{name}` |" in table for name in STANDALONE)
    assert "rollout.aggregation_prompt" not in GUIDE and "rollout.search_prompt" not in GUIDE  # re-exports


def test_the_one_prompt_example_runs_with_only_the_three_standalone_files(tmp_path):
    """A porter's folder: the per-prompt block, run where nothing of this repository but the copied files exists."""
    code = next(code for _, code in BLOCKS if "from prompts import" in code and "spiral_advantages(" in code)
    for name in STANDALONE:
        (tmp_path / name).write_text((ROOT / name).read_text())
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", code + "\nprint(adv_N1.tolist())"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert len(ast.literal_eval(done.stdout)) == 8


def test_the_guide_pins_the_versions_it_was_checked_against():
    import trl_spiral

    for name, version in PINNED.items():
        assert f"{name} {version}" in GUIDE
        if importlib.util.find_spec(name) is not None:  # the engines environment installs exactly these
            assert importlib.metadata.version(name) == version, f"{name} {importlib.metadata.version(name)}"
    assert trl_spiral.TESTED_WITH == {"trl": PINNED["trl"], "peft": PINNED["peft"]}
    assert f"trl=={PINNED['trl']} peft=={PINNED['peft']}" in GUIDE


@pytest.mark.parametrize("name", [
    "flat_spiral_advantages", "flat_group_advantages", "length_aware", "spiral_advantages",
])
def test_named_advantage_functions_exist(name):
    assert callable(getattr(advantages, name)) and name in GUIDE


def test_named_project_functions_and_flags_exist():
    for module, name in [(lora, "resolve_base_path"), (lora, "load_adapter"), (logprobs, "LOGIT_POST_PROCESSING"),
                         (train, "importance_sampling_loss"), (train, "loss_normalizer")]:
        assert hasattr(module, name) and name in GUIDE
    assert "--unbiased-set-rl" in GUIDE and "unbiased_set_rl" in train.TrainConfig.__dataclass_fields__
    assert "gradient_scale_M" in GUIDE and train.TrainConfig.lora_rank == 32 and "rank is 32" in GUIDE
    for path, names in [("trl_spiral.py", ["SpiralGRPOTrainer", "resolve", "_compute_loss",
                                           "_generate_and_score_completions", "loss_is_scaled_for_ga"]),
                        ("trl_args.py", ["SpiralArguments", "PINNED", "derived_settings", "trl_defaults"]),
                        ("verl_spiral.py", ["spiral_extra_fields", "compute_spiral_advantage", "spiral_trainer_class",
                                            "SpiralPPOTrainer", "_compute_advantage"]),
                        ("recipe/spiral/main_spiral.py", ["SpiralTaskRunner", "check_spiral_config"])]:
        source = (ROOT / path).read_text()
        assert path.split("/")[-1] in GUIDE and all(name in source and name in GUIDE for name in names)
    for path in ["recipe/trl/ddp.yaml", "recipe/trl/zero3.yaml", "recipe/trl/fsdp2.yaml", "recipe/trl/paper.yaml",
                 "recipe/spiral/REQUIRED_VERL.txt", "recipe/spiral/prepare_data.py",
                 "recipe/spiral/run_spiral_qwen3_4b_8gpu.sh", "recipe/spiral/run_spiral_qwen3_4b_multinode.sh"]:
        assert (ROOT / path).is_file() and path.split("/")[-1] in GUIDE, path
