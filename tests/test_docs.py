"""The documents say what the code does: every `module.name` the README's tables cite exists, the reading order's
line counts are the files' own, every local link resolves, and every flag a documented command passes is one its
script accepts (its own --help lists it)."""

import ast
import functools
import importlib.util
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ["README.md", "OPERATING.md", "EXPERIMENTS.md", "PORTING.md", "benchmarks/README.md",
        "recipe/spiral/README.md"]
DOCS = [d for d in DOCS if (ROOT / d).exists()]


def read(doc: str) -> str:
    return (ROOT / doc).read_text(encoding="utf-8")


def section(text: str, heading: str) -> str:
    """The text of the `## heading` section, up to the next `## `."""
    start = text.index(f"## {heading}")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


@functools.cache
def defined_names(module: str) -> set[str]:
    """Top-level functions, classes and assignments of a project module, and each class's methods (as Class.name)."""
    path = ROOT / (module.replace(".", "/") + ".py")
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
            if isinstance(node, ast.ClassDef):
                names |= {f"{node.name}.{n.name}" for n in node.body if isinstance(n, ast.FunctionDef)}
                names |= {f"{node.name}.{n.target.id}" for n in node.body  # dataclass fields
                          if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.ImportFrom):  # re-exports, e.g. rollout.search_prompt from prompts.py
            names |= {a.asname or a.name for a in node.names}
    return names


def cited_names(text: str) -> list[str]:
    """`module.name` (or `module.Class.method`) in backticks, where module is a top-level .py file."""
    modules = {p.stem for p in ROOT.glob("*.py")}
    found = []
    for code in re.findall(r"`([^`]+)`", text):
        for m in re.finditer(r"\b([a-z_]+)\.([A-Za-z_][\w.]*\*?)", code):
            if m.group(1) in modules and not m.group(2).endswith(("py", "json", "jsonl", "md", "png")):
                found.append(f"{m.group(1)}.{m.group(2).rstrip('.')}")
    return found


def exists(module: str, name: str) -> bool:
    """`name` is defined in `module`; `prefix*` (as in `spiral.collect_*`) when some name starts with the prefix."""
    names = defined_names(module)
    return any(n.startswith(name[:-1]) for n in names) if name.endswith("*") else name in names


@pytest.mark.parametrize("heading", ["Algorithm 1, line by line", "Paper to code"])
def test_every_name_the_readme_maps_the_paper_to_exists(heading):
    names = cited_names(section(read("README.md"), heading))
    assert len(names) > 10
    missing = [n for n in names if not exists(*n.split(".", 1))]
    assert not missing, f"the README cites names the code does not define: {missing}"


def test_the_reading_order_counts_the_files_lines():
    """Each "file | lines" row is within 15% (or 10 lines) of the file's length today."""
    rows = re.findall(r"^\| (?:read|skim|skip) \| (.+?) \| ([\d, ]+?) \|", section(read("README.md"), "Read in this"),
                      re.M)
    assert len(rows) > 8
    wrong = []
    for files, counts in rows:
        paths = re.findall(r"`([^`]+\.py)`", files)
        stated = [int(c.replace(",", "")) for c in counts.split(", ")]
        if len(stated) != len(paths):
            continue  # one count for several files ("210 each" or a total): checked by hand
        for path, count in zip(paths, stated):
            real = len((ROOT / path).read_text().splitlines())
            if abs(real - count) > max(10, 0.15 * real):
                wrong.append(f"{path}: stated {count}, has {real}")
    assert not wrong, wrong


@pytest.mark.parametrize("doc", DOCS)
def test_local_links_resolve(doc):
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", read(doc))
    base = (ROOT / doc).parent
    missing = [link for link in links if not link.startswith("http") and not (base / link).exists()]
    assert not missing, f"{doc} links to {missing}"


# ----------------------------------------------------------------------------------------------------------------------
# Documented commands: each --flag is one the script lists in its --help


SCRIPT = re.compile(r"python(?:3\.11)?\s+(?:-m\s+([\w.]+)|([\w/.-]+\.py))")


def documented_commands(text: str) -> list[tuple[str, list[str]]]:
    """(script, flags) for each `python SCRIPT ...` line of the document's code blocks and inline code, with its
    backslash-continued lines; `accelerate launch ... SCRIPT` and `torchrun ... SCRIPT` count too."""
    blocks = re.findall(r"```(?:bash)?\n(.*?)```", text, re.S) + re.findall(r"`([^`\n]*python[^`\n]*)`", text)
    blocks += [m for m in re.findall(r"^    (.+)$", text, re.M)]  # indented command lines
    commands = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#")[0]
            m = SCRIPT.search(line) or re.search(r"(?:launch|torchrun)\b.*?\s([\w/.-]+\.py)", line)
            if not m:
                continue
            script = next(g for g in m.groups() if g)
            flags = re.findall(r"(?<![\w-])(--[a-z][\w-]*)", line[m.end():])
            commands.append((script, flags))
    return commands


def help_text(script: str) -> str | None:
    """The script's --help output, or None when it needs an engine that is not installed here."""
    if script.startswith("recipe.") or script in ("trl_spiral.py",) or script.endswith("main_spiral.py"):
        if importlib.util.find_spec("trl" if "trl" in script else "verl") is None:
            return None
    args = ["-m", script] if not script.endswith(".py") else [script]
    done = subprocess.run([sys.executable, *args, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    return done.stdout + done.stderr


def commands_by_script() -> dict[str, set[str]]:
    by_script: dict[str, set[str]] = {}
    for doc in DOCS:
        for script, flags in documented_commands(read(doc)):
            if script in ("pytest", "venv"):  # standard tools, not ours
                continue
            if (ROOT / script).exists() or importlib.util.find_spec(script.split(".")[0]) is not None:
                by_script.setdefault(script, set()).update(flags)
    return by_script


def test_the_documents_name_the_main_commands():
    scripts = commands_by_script()
    assert {"train.py", "evaluate.py", "benchmarks/reproduce.py"} <= set(scripts), sorted(scripts)


@pytest.mark.parametrize("script", sorted(commands_by_script()))
def test_every_documented_flag_is_accepted(script):
    text = help_text(script)
    if text is None:
        pytest.skip(f"{script} needs an engine that is not installed here (.ci/engines checks it)")
    unknown = sorted(flag for flag in commands_by_script()[script] if flag not in text and flag != "--help")
    assert not unknown, f"the documents pass {script} flags its --help does not list: {unknown}"


@pytest.mark.parametrize("shipped, anchor", [("benchmarks/second_task.md", "**SPIRAL against GRPO**"),
                                             ("benchmarks/set_rl.md", "## What set RL adds")])
def test_experiments_carry_the_shipped_tables_as_the_scripts_wrote_them(shipped, anchor):
    """Every table row the script wrote into its shipped Markdown appears, in order, in EXPERIMENTS.md's section: a
    regenerated result that was not copied over (or a hand-edited cell) fails here."""
    rows = [line.strip() for line in (ROOT / shipped).read_text(encoding="utf-8").splitlines() if line.startswith("|")]
    text = (ROOT / "EXPERIMENTS.md").read_text(encoding="utf-8")
    section = [line.strip() for line in text[text.index(anchor):].splitlines() if line.startswith("|")]
    assert rows and section[:len(rows)] == rows
