"""Set up and check SPIRAL-ref on a fresh machine with nothing but Python 3.11 (standard library only):

    python3.11 dev.py demo     # create .venv at constraints.txt's pins, then the CPU demo (python train.py --preset tiny)
    python3.11 dev.py test     # the same .venv, then the tests: the default suite, then the slow end-to-end ones

Why a Python script and not a Makefile, tox/nox or uv: a fresh machine has Python but not always make (the
python:3.11-slim image has none); nox and tox must be installed first and build one environment per session; uv's
lock resolves torch for every platform, and on Linux that is the multi-GB CUDA build where the demo needs the CPU one.
pip with a constraints file installs exactly the versions CI tests (requirements.txt keeps the ranges the code needs).

The environment is .venv in the repository (created once; packages installed again only when requirements.txt or
constraints.txt change, recorded in .venv/spiral-ref-installed). A .venv that is not a virtual environment is never
touched. Extra arguments after `demo` go to train.py (e.g. `--algo grpo`); after `test`, to both pytest calls. `test`
runs both suites even if the first fails, then reports each (exit status non-zero if either failed). Ctrl-C stops the
command under way, which says so in its own line (train.py: "continue with --resume"); dev.py then exits 130.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import venv

ROOT = os.path.dirname(os.path.abspath(__file__))
VENV = os.path.join(ROOT, ".venv")
STAMP = os.path.join(VENV, "spiral-ref-installed")
PYTHON = os.path.join(VENV, "Scripts" if os.name == "nt" else "bin", "python")
INSTALL = ["-r", "requirements.txt", "-c", "constraints.txt", "matplotlib"]  # matplotlib: the demo's figures
NO_SPACE = (os.strerror(errno.ENOSPC), f"[Errno {errno.ENOSPC}]")  # a full disk in pip's, ensurepip's output


def fail(message: str, code: int = 2) -> None:
    print(f"dev.py: error: {message}", file=sys.stderr)
    sys.exit(code)


def full_disk(*paths: str) -> str:
    """"the disk is full (N MiB free for PATH, ...)": the cause named, with the space left where the failed step
    writes (pip unpacks into the temporary folder, then copies into .venv)."""
    free = []
    for path in paths:
        while not os.path.exists(path):
            path = os.path.dirname(path)
        try:
            free.append(f"{shutil.disk_usage(path).free / 2**20:.0f} MiB free for {path}")
        except OSError:
            pass
    return f"the disk is full ({', '.join(free) or 'no space left on device'}); free some space and run it again"


def why(exc: BaseException, *paths: str) -> str:
    """The cause of a failed step in a few words; a full disk is named as such (ensurepip's failure is a
    CalledProcessError whose captured output holds the real cause)."""
    output = getattr(exc, "output", None) or b""
    text = output.decode(errors="replace") if isinstance(output, bytes) else str(output)
    if getattr(exc, "errno", None) == errno.ENOSPC or any(mark in text for mark in NO_SPACE):
        return full_disk(*paths)
    return getattr(exc, "strerror", None) or str(exc)


def wanted_stamp() -> str:
    """What the installed packages were resolved from: the two files and the install command."""
    h = hashlib.sha256(" ".join(INSTALL).encode())
    for name in ("requirements.txt", "constraints.txt"):
        with open(os.path.join(ROOT, name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def requirements() -> list[str]:
    """The names of the packages the install asks for: requirements.txt's, then INSTALL's own (matplotlib)."""
    with open(os.path.join(ROOT, "requirements.txt"), encoding="utf-8") as f:
        named = [re.match(r"[A-Za-z0-9._-]*", line.split("#")[0].strip()).group() for line in f]
    return [name for name in named if name] + INSTALL[4:]


def environment() -> str:
    """.venv with the pinned packages (created or brought up to date); the path of its Python."""
    if os.path.lexists(VENV) and not os.path.isfile(os.path.join(VENV, "pyvenv.cfg")):
        fail(f"{VENV} exists and is not a virtual environment; move it away (dev.py does not touch it)")
    if not os.path.isfile(PYTHON):
        print(f"dev.py: creating {VENV} (Python {sys.version.split()[0]}) and installing pip into it", flush=True)
        made_here = not os.path.lexists(VENV)
        try:
            venv.create(VENV, with_pip=True)
        except (OSError, subprocess.CalledProcessError, KeyboardInterrupt) as e:  # read-only, full disk, Ctrl-C
            if made_here:  # half made, a later run would take it for made and fail in pip: remove what this made
                shutil.rmtree(VENV, ignore_errors=True)
            if isinstance(e, KeyboardInterrupt):
                print(f"dev.py: interrupted; {VENV} was not finished{' and is removed' if made_here else ''}",
                      file=sys.stderr)
                sys.exit(130)
            fail(f"cannot create {VENV}: {why(e, VENV)}")
    try:
        with open(STAMP) as f:
            installed = f.read().strip()
    except OSError:
        installed = None
    if installed != wanted_stamp():
        packages = requirements()
        print(f"dev.py: installing {len(packages)} packages ({', '.join(packages)}) and their dependencies at "
              "constraints.txt's pins; pip prints nothing until it is done (minutes the first time)", flush=True)
        print(f"dev.py: $ pip install {' '.join(INSTALL)}", flush=True)
        errors: list[str] = []
        code = run([PYTHON, "-m", "pip", "install", "--quiet", *INSTALL], stderr_seen=errors)
        if code:
            text = "".join(errors)
            cause = full_disk(VENV, tempfile.gettempdir()) if any(m in text for m in NO_SPACE) else \
                "its message is above"
            fail(f"pip install failed (exit {code}): {cause}", code=1)
        try:
            with open(STAMP, "w") as f:
                f.write(wanted_stamp() + "\n")
        except OSError as e:
            fail(f"cannot write {STAMP}: {why(e, STAMP)}", code=1)
    return PYTHON


def run(command: list[str], stderr_seen: list[str] | None = None) -> int:
    """Run a command in the repository root and wait for it; its exit status. `stderr_seen`: a list to collect its
    stderr lines in (they still reach the screen).

    Ctrl-C: a terminal sends SIGINT to its whole foreground process group, so the command has it too and stops as it
    does on its own (train.py finishes its "continue with --resume" line). dev.py waits for that, then exits 130 with
    no traceback. (subprocess.run would raise KeyboardInterrupt here and kill the command 0.25 s later, mid-sentence.)
    The handler is Python's, not SIG_IGN: exec resets it to the default in the command, whose Ctrl-C then works. A
    dev.py started with SIGINT ignored (in the background) keeps it ignored, and so does the command."""
    interrupted = []
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(signum))
    try:
        relay = {} if stderr_seen is None else {"stderr": subprocess.PIPE, "text": True, "errors": "replace"}
        proc = subprocess.Popen(command, cwd=ROOT, **relay)
        for line in proc.stderr or ():
            print(line, end="", file=sys.stderr, flush=True)
            stderr_seen.append(line)
        code = proc.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
    if interrupted:
        if code < 0:  # ended by the signal itself, so it said nothing
            print(f"dev.py: interrupted ({os.path.basename(command[0])} {' '.join(command[1:3])})", file=sys.stderr)
        sys.exit(130)
    return code


def verdict(code: int) -> str:
    """A pytest exit status in words."""
    return {0: "passed", 1: "FAILED", 5: "selected no tests"}.get(code, f"did not run to the end (pytest exit {code})")


def main(argv: list[str]) -> int:
    if len(argv) < 1 or argv[0] not in ("demo", "test"):
        if argv[:1] in (["-h"], ["--help"]):
            print(__doc__)
            return 0
        fail("expected `python3.11 dev.py demo` or `python3.11 dev.py test` (--help: what they do)")
    if sys.version_info < (3, 11):
        fail(f"needs Python 3.11 or newer (the pinned packages require it); this is {sys.version.split()[0]}")
    command, extra = argv[0], argv[1:]
    try:
        python = environment()
        if command == "demo":
            out = os.path.join(ROOT, "runs", "tiny-spiral")
            # A second `dev.py demo` continues the first run (or prints its table if it finished), never replaces it.
            again = ["--resume"] if os.path.isfile(os.path.join(out, "config.json")) and not extra else []
            print(f"dev.py: $ python train.py --preset tiny {' '.join(again + extra)}".rstrip(), flush=True)
            return run([python, "train.py", "--preset", "tiny", *again, *extra])
        codes = {}
        for suite, selection in (("default", []), ("slow", ["-m", "slow"])):  # pytest.ini deselects the slow tests
            print(f"dev.py: $ python -m pytest -q {' '.join(selection + extra)} tests".replace("  ", " "), flush=True)
            codes[suite] = run([python, "-m", "pytest", "-q", *selection, *extra, "tests"])
    except KeyboardInterrupt:  # between the commands (a command's own Ctrl-C is run's)
        print("dev.py: interrupted", file=sys.stderr)
        return 130
    for suite, code in codes.items():
        print(f"dev.py: the {suite} suite {verdict(code)}", file=sys.stderr if code not in (0, 5) else sys.stdout)
    failed = [code for code in codes.values() if code not in (0, 5)]
    return failed[0] if failed else (5 if set(codes.values()) == {5} else 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
