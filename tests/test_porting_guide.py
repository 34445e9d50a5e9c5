"""PORTING.md's code runs: every fenced block is executed in order in one namespace, except those whose first line
says `# needs verl|trl|vllm|peft`, which are only checked to parse. And the guide names what the code has."""

import ast
import pathlib
import re

import pytest

import advantages
import logprobs
import lora
import train

ROOT = pathlib.Path(__file__).resolve().parents[1]
GUIDE = (ROOT / "PORTING.md").read_text()
BLOCKS = re.findall(r"^```(\w*)\n(.*?)^```$", GUIDE, flags=re.S | re.M)
NEEDS = re.compile(r"# needs (verl|trl|vllm|peft)\b")


def test_every_block_is_python_and_either_runs_or_says_what_it_needs():
    assert len(BLOCKS) >= 6
    for language, code in BLOCKS:
        assert language == "python", f"a ```{language} block: the test cannot run it"
        ast.parse(code)  # even a block that is not run must be valid Python


def test_the_runnable_blocks_run_in_order():
    runnable = [code for _, code in BLOCKS if not NEEDS.match(code)]
    assert len(runnable) >= 4 and len(runnable) < len(BLOCKS)
    namespace = {"__name__": "porting_guide"}
    for number, code in enumerate(runnable):
        exec(compile(code, f"PORTING.md runnable block {number}", "exec"), namespace)
    assert namespace["adv_BT"].shape == (2 * (4 + 2 * 2), 6)
    assert namespace["adv_BT"].abs().max() > 0  # the example has signal


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
