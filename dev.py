"""Set up and check SPIRAL-ref on a fresh machine with nothing but Python 3.11 (standard library only):

    python3.11 dev.py demo     # create .venv at constraints.txt's pins, then the CPU demo (python train.py --preset tiny)
    python3.11 dev.py test     # the same .venv, then the tests: the default suite, then the slow end-to-end ones

Why a Python script and not a Makefile, tox/nox or uv: a fresh machine has Python but not always make (the
python:3.11-slim image has none); nox and tox must be installed first and build one environment per session; uv's
lock resolves torch for every platform, and on Linux that is the multi-GB CUDA build where the demo needs the CPU one.
pip with a constraints file installs exactly the versions CI tests (requirements.txt keeps the ranges the code needs).

The environment is .venv in the repository (created once; packages installed again only when requirements.txt or
constraints.txt change, recorded in .venv/spiral-ref-installed). A .venv that is not a virtual environment is never
touched. Extra arguments after `demo` go to train.py (e.g. `--algo grpo`); after `test`, to both pytest calls.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import venv

ROOT = os.path.dirname(os.path.abspath(__file__))
VENV = os.path.join(ROOT, ".venv")
STAMP = os.path.join(VENV, "spiral-ref-installed")
PYTHON = os.path.join(VENV, "Scripts" if os.name == "nt" else "bin", "python")
INSTALL = ["-r", "requirements.txt", "-c", "constraints.txt", "matplotlib"]  # matplotlib: the demo's figures


def fail(message: str) -> None:
    print(f"dev.py: error: {message}", file=sys.stderr)
    sys.exit(2)


def wanted_stamp() -> str:
    """What the installed packages were resolved from: the two files and the install command."""
    h = hashlib.sha256(" ".join(INSTALL).encode())
    for name in ("requirements.txt", "constraints.txt"):
        with open(os.path.join(ROOT, name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def environment() -> str:
    """.venv with the pinned packages (created or brought up to date); the path of its Python."""
    if os.path.lexists(VENV) and not os.path.isfile(os.path.join(VENV, "pyvenv.cfg")):
        fail(f"{VENV} exists and is not a virtual environment; move it away (dev.py does not touch it)")
    if not os.path.isfile(PYTHON):
        print(f"dev.py: creating {VENV} (Python {sys.version.split()[0]})", flush=True)
        made_here = not os.path.lexists(VENV)
        try:
            venv.create(VENV, with_pip=True)
        except (OSError, subprocess.CalledProcessError) as e:  # a read-only checkout, a full disk, ensurepip failing
            if made_here:  # half made, a later run would take it for made and fail in pip: remove what this made
                shutil.rmtree(VENV, ignore_errors=True)
            fail(f"cannot create {VENV}: {getattr(e, 'strerror', None) or e}")
    try:
        with open(STAMP) as f:
            installed = f.read().strip()
    except OSError:
        installed = None
    if installed != wanted_stamp():
        print(f"dev.py: $ pip install {' '.join(INSTALL)}", flush=True)
        run([PYTHON, "-m", "pip", "install", "--quiet", *INSTALL])
        with open(STAMP, "w") as f:
            f.write(wanted_stamp() + "\n")
    return PYTHON


def run(command: list[str]) -> None:
    """Run a command in the repository root; on failure exit with its code (the command said why)."""
    code = subprocess.run(command, cwd=ROOT).returncode
    if code:
        sys.exit(code)


def main(argv: list[str]) -> int:
    if len(argv) < 1 or argv[0] not in ("demo", "test"):
        if argv[:1] in (["-h"], ["--help"]):
            print(__doc__)
            return 0
        fail("expected `python3.11 dev.py demo` or `python3.11 dev.py test` (--help: what they do)")
    if sys.version_info < (3, 11):
        fail(f"needs Python 3.11 or newer (the pinned packages require it); this is {sys.version.split()[0]}")
    command, extra = argv[0], argv[1:]
    python = environment()
    if command == "demo":
        out = os.path.join(ROOT, "runs", "tiny-spiral")
        # A second `dev.py demo` continues the first run (or prints its table if it finished), never replaces it.
        again = ["--resume"] if os.path.isfile(os.path.join(out, "config.json")) and not extra else []
        print(f"dev.py: $ python train.py --preset tiny {' '.join(again + extra)}".rstrip(), flush=True)
        run([python, "train.py", "--preset", "tiny", *again, *extra])
    else:
        for selection in ([], ["-m", "slow"]):  # pytest.ini deselects the slow tests; CI runs them second
            print(f"dev.py: $ python -m pytest -q {' '.join(selection + extra)} tests".replace("  ", " "), flush=True)
            run([python, "-m", "pytest", "-q", *selection, *extra, "tests"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
