"""The layout a reader and a porter rely on: one concept per file, each readable in one sitting, and the files
meant to be copied alone import nothing from the project."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROJECT = {p.stem for p in ROOT.glob("*.py")}


def imported_modules(path):
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):  # function-level imports count too
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", sorted(ROOT.glob("*.py")), ids=lambda p: p.name)
def test_every_module_reads_in_one_sitting(path):
    assert len(path.read_text().splitlines()) <= 600


@pytest.mark.parametrize("name, allowed", [
    ("setsample", {"itertools", "math", "numpy"}),
    ("advantages", {"numpy"}),
    ("lora", {"__future__", "contextlib", "json", "math", "os", "shutil", "torch", "safetensors"}),
    ("logprobs", {"__future__", "dataclasses", "torch"}),
    ("attention", {"__future__", "torch"}),
    ("prompts", {"re", "sys"}),
])
def test_files_meant_to_be_copied_alone_import_no_project_module(name, allowed):
    imports = imported_modules(ROOT / f"{name}.py")
    assert not imports & (PROJECT - {name}), f"{name}.py imports {imports & PROJECT}"
    assert imports <= allowed, f"{name}.py imports {imports - allowed}"


def test_evaluate_does_not_need_the_training_code():
    assert "train" not in imported_modules(ROOT / "evaluate.py")


def test_no_import_cycle_between_project_modules():
    """A module's imports (function-level ones included) never lead back to it: rollout.py does not import tiny.py,
    which imports rollout (tiny registers its policy and problems with rollout instead)."""
    graph = {p.stem: imported_modules(p) & PROJECT - {p.stem} for p in ROOT.glob("*.py")}

    def reaches(start, target, seen):
        for name in graph.get(start, ()):
            if name == target or (name not in seen and not seen.add(name) and reaches(name, target, seen)):
                return True
        return False

    cycles = sorted(name for name in graph if reaches(name, name, set()))
    assert not cycles, f"modules on an import cycle: {cycles}"
