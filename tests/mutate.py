"""A small mutation harness: plant each bug of a list in one module, run that module's tests, and report which bugs
the tests caught. A bug that survives names a behaviour no test pins.

    python tests/mutate.py cli.py                          # tests/mutations/cli.txt against the tests it names
    python tests/mutate.py cli.py tests/test_cli.py        # against other test files
    python tests/mutate.py cli.py --only 2,5 -- -k resume  # two of the mutations; after --, arguments for pytest
    python tests/mutate.py cli.py --list                   # print the mutations, run nothing

Each run works on a copy of the repository (the files git tracks or would track), so the checkout is never left
mutated. First the tests run on the unmutated copy (they must pass), then once per mutation with `pytest -x`: a
failure, an error or a timeout (twice the unmutated time plus a minute) counts as caught.

A mutation list, tests/mutations/MODULE.txt, is plain text:

    tests: tests/test_cli.py tests/test_train.py       the default test files (one `tests:` line)
    @ --save-every 0 accepted                          a mutation: a one-line description of the bug, then
    <     counts = ["steps", "save_every", "batch_problems",     the exact text it replaces ("< " + the line), and
    >     counts = ["steps", "batch_problems",                   the text it puts there instead ("> " + the line)

The `<` text must occur exactly once in the module. Several `<` (or `>`) lines are one multi-line text; a lone `<`
or `>` is an empty line; no `>` line deletes the text; `#` starts a comment line. tests/test_mutate.py checks that
every list still applies to its module.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LISTS = os.path.join(ROOT, "tests", "mutations")


@dataclass
class Mutation:
    """One planted bug: replace `old` (exactly one occurrence in the module) with `new`."""

    description: str
    old: str
    new: str
    line: int  # where it starts in the list file, for messages


def parse(text: str, name: str = "list") -> tuple[list[str], list[Mutation]]:
    """(default test files, mutations) of a mutation list; ValueError naming the line for anything malformed."""
    tests, mutations, current = [], [], None
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("#") or not line.strip():
            continue
        if line.startswith("tests:"):
            tests += line[len("tests:"):].split()
        elif line.startswith("@"):
            current = {"description": line[1:].strip(), "old": [], "new": [], "line": number}
            mutations.append(current)
        elif line[:1] in ("<", ">") and line[1:2] in ("", " ") and current is not None:
            current["old" if line[0] == "<" else "new"].append(line[2:])
        else:
            raise ValueError(f"{name}, line {number}: expected 'tests:', '@ description', '< old' or '> new'")
    for m in mutations:
        if not m["old"]:
            raise ValueError(f"{name}, line {m['line']}: mutation {m['description']!r} has no '<' line")
    return tests, [Mutation(m["description"], "\n".join(m["old"]), "\n".join(m["new"]), m["line"])
                   for m in mutations]


def apply(source: str, mutation: Mutation) -> str:
    """The module's source with the mutation planted; ValueError unless its old text occurs exactly once."""
    count = source.count(mutation.old)
    if count != 1:
        raise ValueError(f"line {mutation.line} ({mutation.description}): its '<' text occurs {count} times in the "
                         "module, not once; update the list")
    return source.replace(mutation.old, mutation.new)


def copy_repository(destination: str) -> None:
    """The files git tracks or would track (no __pycache__, no runs/), into `destination`."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, names):
        source = os.path.join(ROOT, name)
        if os.path.isfile(source):
            os.makedirs(os.path.dirname(os.path.join(destination, name)), exist_ok=True)
            shutil.copy2(source, os.path.join(destination, name))


def run_tests(copy: str, tests: list[str], pytest_args: list[str], timeout: float) -> tuple[str, str, float]:
    """("passed" | "failed" | "error" | "timeout", the first failing test or the error, seconds)."""
    # no .pyc: a stale one with the mutated file's size and mtime second would be imported instead of the mutant
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-rfE", "-p", "no:cacheprovider", *tests, *pytest_args]
    start = time.monotonic()
    try:
        done = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", f"over {timeout:.0f} s", time.monotonic() - start
    seconds = time.monotonic() - start
    lines = done.stdout.splitlines()
    first = next((line.split(" - ")[0] for line in lines if line.startswith(("FAILED ", "ERROR "))), "")
    if done.returncode == 0:
        return "passed", "", seconds
    if done.returncode == 1:
        return "failed", first, seconds
    last = (lines or done.stderr.splitlines() or ["no output"])[-1]
    return "error", first or f"pytest exit {done.returncode}: {last[:100]}", seconds


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit code 2, no usage block (as train.py and evaluate.py)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="tests/mutate.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("module", help="the module to mutate, e.g. cli.py")
    parser.add_argument("tests", nargs="*", help="test files or ids (default: the list's `tests:` line)")
    parser.add_argument("--mutations", help="the mutation list (default: tests/mutations/MODULE.txt)")
    parser.add_argument("--only", help="comma-separated mutation numbers (1-based) to run")
    parser.add_argument("--list", action="store_true", help="print the numbered mutations and exit")
    parser.add_argument("--timeout", type=float, help="seconds per run (default: 2 x the unmutated run + 60)")
    argv = sys.argv[1:] if argv is None else argv
    pytest_args = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)

    module = os.path.relpath(os.path.abspath(args.module), ROOT)
    if module.startswith(os.pardir + os.sep):  # the copy's module is written at copy/MODULE: never outside it
        parser.error(f"{args.module} is outside the repository {ROOT}")
    list_path = args.mutations or os.path.join(LISTS, os.path.splitext(os.path.basename(module))[0] + ".txt")
    if not os.path.isfile(os.path.join(ROOT, module)) or not os.path.isfile(list_path):
        parser.error(f"need {module} and its mutation list {os.path.relpath(list_path)}")
    if args.timeout is not None and not args.timeout > 0:
        parser.error(f"--timeout must be positive, got {args.timeout}")
    try:
        wanted = {int(n) for n in args.only.split(",")} if args.only else None
    except ValueError:
        parser.error(f"--only expects comma-separated mutation numbers, got {args.only!r}")
    listed = os.path.relpath(list_path)
    try:
        with open(list_path) as f:
            default_tests, mutations = parse(f.read(), listed)
        with open(os.path.join(ROOT, module)) as f:
            source = f.read()
        numbered = [(n, m) for n, m in enumerate(mutations, start=1) if wanted is None or n in wanted]
        mutated = {n: apply(source, m) for n, m in numbered}  # every mutation applies before anything runs
    except OSError as e:
        parser.error(f"cannot read {e.filename}: {e.strerror}")
    except ValueError as e:  # not text; a malformed list (parse names it); a mutation that no longer applies
        parser.error(str(e) if str(e).startswith(listed) else f"{listed}: {e}")
    unknown = sorted((wanted or set()) - {n for n, _ in numbered})
    if unknown:
        parser.error(f"--only {unknown[0]}: {listed} numbers its mutations 1 to {len(mutations)}")
    if args.list:
        for n, m in numbered:
            print(f"{n:3d}. {m.description}")
        return 0
    tests = args.tests or default_tests
    if not tests:
        parser.error("no test files: name them, or give the list a `tests:` line")

    with tempfile.TemporaryDirectory(prefix="mutate-") as copy:
        copy_repository(copy)
        outcome, detail, seconds = run_tests(copy, tests, pytest_args, args.timeout or 3600)
        if outcome != "passed":
            print(f"the tests fail on the unmutated {module} ({outcome}: {detail}); fix that first", file=sys.stderr)
            return 2
        timeout = args.timeout or 2 * seconds + 60
        print(f"{module}: {len(numbered)} mutations against {' '.join(tests)} (unmutated: passed in {seconds:.0f} s)")
        survived = []
        for n, m in numbered:
            with open(os.path.join(copy, module), "w") as f:
                f.write(mutated[n])
            outcome, detail, seconds = run_tests(copy, tests, pytest_args, timeout)
            verdict = "SURVIVED" if outcome == "passed" else "caught"
            how = "; ".join(filter(None, [f"{seconds:.0f} s", outcome if outcome in ("error", "timeout") else "",
                                          detail]))
            print(f"{n:3d}. {verdict:8s} {m.description}  [{how}]", flush=True)
            if outcome == "passed":
                survived.append(n)
        caught = len(numbered) - len(survived)
        print(f"{module}: caught {caught} of {len(numbered)} ({100 * caught / max(len(numbered), 1):.0f} %)"
              + (f"; survived: {', '.join(map(str, survived))}" if survived else ""))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
