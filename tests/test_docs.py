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


# ----------------------------------------------------------------------------------------------------------------------
# The front door: the README's first commands, and the shape suffixes it explains


def test_the_readme_opens_with_dev_py_then_the_plain_install_and_demo():
    """The first code block: dev.py's two commands, then the pair a paper reader types by hand, dev.py's own install
    (dev.INSTALL) and its demo. dev.py's install and the README's cannot drift apart."""
    import dev

    text = read("README.md")
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert text[:block.start()].count("\n") < 30  # on the first screen
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]
    assert commands == ["python3.11 dev.py demo", "python3.11 dev.py test",
                        " ".join(["pip", "install", *dev.INSTALL]), "python train.py --preset tiny"]
    assert "pip install -r requirements.txt -c constraints.txt" in commands[2]


STUDENT_FILES = ["spiral.py", "setsample.py", "advantages.py", "train.py", "prompts.py", "testtime.py"]
SCALARS = {"M"}  # Proposition 3.1's M (train.gradient_scale_M): a number, not an axis


def shape_suffixes(source: str) -> set[str]:
    """The upper-case axis letters of the code's names: adv_K_N2 -> {K, N2}; TrainConfig and N1 alone have none."""
    tree = ast.parse(source)
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    names |= {node.arg for node in ast.walk(tree) if isinstance(node, ast.arg)}
    names |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    names |= {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    return {part for name in names if re.match(r"[a-z]", name)
            for part in name.split("_")[1:] if re.fullmatch(r"[A-Z][A-Z0-9]*", part)} - SCALARS


def test_every_shape_suffix_of_the_files_a_student_reads_is_in_the_readme_convention():
    convention = read("README.md").split("**Names carry their shapes.**")[1].split("\n\n")[0]
    listed = {part for code in re.findall(r"`\w*?(_[A-Za-z0-9_]+)`", convention) for part in code.split("_")[1:]}
    used = {path: shape_suffixes((ROOT / path).read_text()) for path in STUDENT_FILES}
    assert {"K", "N1", "N2", "P", "PK", "B", "T", "R"} <= set().union(*used.values())  # the check sees them
    missing = {path: sorted(parts - listed) for path, parts in used.items() if parts - listed}
    assert not missing, f"suffixes the README's \"Names carry their shapes\" does not list: {missing}"
    assert shape_suffixes("adv_Q_N1 = f(x_b)\nclass TrainConfig: pass\nN1 = 3") == {"Q", "N1"}  # the check can fail


# ----------------------------------------------------------------------------------------------------------------------
# Pointers into the documents stay true: a link's #anchor is a heading of its target, a prose pointer written
# DOC, "Heading" names a heading (or a paragraph's bold lead-in) of DOC, and a pointer the test cannot check ("the
# README's X section", "PORTING.md, section 6", "(README, the CPU demo)") is refused: a renamed or moved section
# then fails here instead of leaving a pointer to nothing.

DOC_NAME = (r"(?:benchmarks/README\.md|recipe/spiral/README\.md|README(?:\.md)?|OPERATING\.md|EXPERIMENTS\.md"
            r"|PORTING\.md)")
QUOTED_POINTER = re.compile(DOC_NAME.replace("(?:", "(", 1) + r", \"([^\"]+)\"")
UNCHECKABLE_POINTERS = [
    re.compile(DOC_NAME + r"\)?(?:'s)?,? sections? \d"),  # a number: true only until sections are renumbered
    re.compile(DOC_NAME + r"'s [^\".\n]{0,40}? section\b"),  # "the README's second-task section"
    re.compile(DOC_NAME + r" \(the [^)\"]{0,40}section\)"),  # "in the main README (the tiny_parts section)"
    re.compile(r"\(" + DOC_NAME + r", the [^)\"]{0,40}\)"),  # "(README, the CPU demo)"
]
SKIPPED_DIRS = {".git", ".venv", "venv", "runs", "__pycache__", "data", "node_modules"}


def text_files() -> list[pathlib.Path]:
    """The repository's own Python, Markdown, YAML and shell files (not environments, runs or data)."""
    return sorted(p for p in ROOT.rglob("*") if p.suffix in {".py", ".md", ".yaml", ".sh"} and p.is_file()
                  and not SKIPPED_DIRS & set(p.relative_to(ROOT).parts))


def headings(doc: str) -> list[str]:
    """The document's headings and bold paragraph lead-ins, without numbering ("7. ") or backticks."""
    found = re.findall(r"^#{1,6} (.+)$", read(doc), re.M) + re.findall(r"^\*\*(.+?)\*\*", read(doc), re.M)
    return [re.sub(r"^\w{1,2}\. ", "", h.replace("`", "")).rstrip(".:").strip() for h in found]


def github_anchor(heading: str) -> str:
    """GitHub's id for a heading: lower case, punctuation but - and _ dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def broken_pointers(text: str) -> list[str]:
    """The prose pointers in `text` that name no heading of their document, or that no test could check."""
    flat = re.sub(r"\s*\n\s*(?:#\s*)?", " ", text)  # a pointer may wrap, in a comment too
    broken = [m.group(0) for pattern in UNCHECKABLE_POINTERS for m in pattern.finditer(flat)]
    for m in QUOTED_POINTER.finditer(flat):
        doc = m.group(1) if m.group(1).endswith(".md") else m.group(1) + ".md"
        wanted = m.group(2).replace("`", "").rstrip(".:").strip()
        if doc in DOCS and not any(h == wanted or h.startswith(wanted + " ") or h.startswith(wanted + ":")
                                   for h in headings(doc)):
            broken.append(m.group(0))
    return broken


def test_prose_pointers_name_headings_that_exist():
    files = text_files()
    assert {"setsample.py", "tiny.py", "tiny_parts.py", "benchmarks/README.md"} <= \
        {str(p.relative_to(ROOT)) for p in files}
    broken = {str(p.relative_to(ROOT)): found for p in files
              if p.name != "test_docs.py" and (found := broken_pointers(p.read_text(encoding="utf-8")))}
    assert not broken, f"pointers to no heading, or that cannot be checked (write DOC, \"Heading\"): {broken}"


@pytest.mark.parametrize("text, ok", [
    ('README, "Proposition 3.1 in numbers"', True),  # a bold lead-in
    ('OPERATING.md, "The result\n    # JSON"', True),  # wrapped, in a comment
    ('PORTING.md, "The loss"', True),  # the start of "5. The loss: this project's settings in verl and TRL"
    ('EXPERIMENTS.md, "A second CPU task"', True),
    ('README, "The tiny_parts task"', False),  # a section that is not there
    ('PORTING.md, "The los"', False),
    ("The README's second-task section has the figures", False),  # the pointers this test was written for
    ("(README, the CPU demo)", False),
    ("are in the main README (the tiny_parts section)", False),
    ("PORTING.md, section 6", False),
    ("[PORTING.md](../../PORTING.md), section 4", False),
])
def test_the_pointer_check_can_fail(text, ok):
    assert (broken_pointers(text) == []) == ok


@pytest.mark.parametrize("doc", DOCS)
def test_link_anchors_name_headings_of_their_target(doc):
    """[text](FILE.md#anchor) and [text](#anchor): the anchor is GitHub's id of one of the target's headings."""
    base = (ROOT / doc).parent
    wrong = []
    for target, anchor in re.findall(r"\]\(([^)#\s]*\.md|)#([^)\s]+)\)", read(doc)):
        path = (base / target).resolve() if target else ROOT / doc
        ids = {github_anchor(h) for h in re.findall(r"^#{1,6} (.+)$", path.read_text(encoding="utf-8"), re.M)}
        if anchor not in ids:
            wrong.append(f"{target}#{anchor}")
    assert not wrong, f"{doc} links to anchors that are no heading: {wrong}"
    assert github_anchor("What set RL adds: SPIRAL against its one-line ablation on `--preset tiny_parts6`") == \
        "what-set-rl-adds-spiral-against-its-one-line-ablation-on---preset-tiny_parts6"
