"""Regenerate every figure and table of the README's CPU demo, with the README's own commands.

    python benchmarks/reproduce.py            # from the repository root; ~6 minutes on 2 idle cores; needs matplotlib

Runs, in order, each command exactly as the README writes it (plus --overwrite, so a rerun replaces its own runs,
and a fresh evaluation cache, so nothing is read from an earlier evaluation):
    python train.py --preset tiny                  -> runs/tiny-spiral (metrics.jsonl, metrics.png, adapter/)
    python train.py --preset tiny --algo grpo      -> runs/tiny-grpo
    python evaluate.py --preset tiny --limit 100 --policy base=data/tiny_warmstart --policy grpo=runs/tiny-grpo/adapter
        --policy spiral=runs/tiny-spiral/adapter --out runs/eval/tiny-comparison.json
then rewrites:
    benchmarks/tiny_metrics.png      the SPIRAL run's dashboard (runs/tiny-spiral/metrics.png)
    benchmarks/tiny_comparison.png   evaluate.py's figure (runs/eval/tiny-comparison.png)
    README.md, between its "<!-- reproduce.py: NAME -->" and "<!-- /reproduce.py -->" markers: `demo` (the first and
        last 10% of steps of both runs), `comparison` (the side-by-side table), `provenance` (date, versions, times).
Nothing else in the README changes, so prose quotes no number that these blocks hold. The runs are deterministic:
the same versions (constraints.txt) give the same tables; tests/test_fingerprint.py catches a drift in CI.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import checkpoint  # noqa: E402
import figures  # noqa: E402

TRAIN = {"spiral": ["train.py", "--preset", "tiny"], "grpo": ["train.py", "--preset", "tiny", "--algo", "grpo"]}
EVALUATE = ["evaluate.py", "--preset", "tiny", "--limit", "100", "--policy", "base=data/tiny_warmstart",
            "--policy", "grpo=runs/tiny-grpo/adapter", "--policy", "spiral=runs/tiny-spiral/adapter",
            "--out", "runs/eval/tiny-comparison.json"]
LABELS = {"base": "warm start", "grpo": "GRPO", "spiral": "SPIRAL"}


def run(args: list[str]) -> float:
    """Run `python ARGS` in the repository root (output to this terminal); seconds it took."""
    print("$ python " + " ".join(args), flush=True)
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], cwd=ROOT, check=True)
    return time.perf_counter() - start


def demo_table(spiral_rows: list[dict], grpo_rows: list[dict]) -> str:
    """figures.first_last_table of the SPIRAL run, then the GRPO run's rows under the same header."""
    spiral, grpo = figures.first_last_table(spiral_rows), figures.first_last_table(grpo_rows)
    if spiral.splitlines()[0] != grpo.splitlines()[0]:
        raise SystemExit("reproduce.py: the two runs have different numbers of steps")
    return "\n".join(spiral.splitlines() + grpo.splitlines()[2:])


def comparison_table(result: dict) -> str:
    """The README's side-by-side table from evaluate.py's JSON: pass@1/4/8, majority@4/8, RSA per population."""
    first = next(iter(result["policies"].values()))["summary"]
    pass_k = [k for k in (1, 4, 8) if k in first["passk"]["k"]]
    majority_k = [k for k in (4, 8) if k in first["majority"]["k"]]
    steps = "/".join(str(t) for t in first["rsa"][0]["step"])
    header = ([f"pass@{k}" for k in pass_k] + [f"majority@{k}" for k in majority_k]
              + [f"RSA P={r['population']}, steps {steps}" for r in first["rsa"]])
    lines = ["| | " + " | ".join(header) + " |", "|---" * (len(header) + 1) + "|"]
    for label, policy in result["policies"].items():
        s = policy["summary"]
        cells = [f"{s['passk']['pass_at_k'][s['passk']['k'].index(k)]:.3f}" for k in pass_k]
        cells += [f"{s['majority']['accuracy'][s['majority']['k'].index(k)]:.3f}" for k in majority_k]
        cells += [" / ".join(f"{v:.3f}" for v in r["pass_at_1"]) for r in s["rsa"]]
        lines.append(f"| {LABELS.get(label, label)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def replace_block(text: str, name: str, content: str) -> str:
    """text with the lines between "<!-- reproduce.py: name -->" and the next "<!-- /reproduce.py -->" replaced."""
    pattern = re.compile(rf"(<!-- reproduce\.py: {name} -->\n).*?(<!-- /reproduce\.py -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"reproduce.py: README.md has no <!-- reproduce.py: {name} --> block")
    return pattern.sub(lambda m: m.group(1) + content.rstrip("\n") + "\n" + m.group(2), text, count=1)


def main() -> int:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("reproduce.py: needs matplotlib for the figures (pip install -r requirements.txt -c constraints.txt "
              "matplotlib)", file=sys.stderr)
        return 2
    seconds = {algo: run([*args, "--overwrite"]) for algo, args in TRAIN.items()}
    with tempfile.TemporaryDirectory() as cache:  # cold: the README's numbers come from this code's traces
        seconds["evaluate"] = run([*EVALUATE, "--cache-dir", cache])

    for made, kept in [("runs/tiny-spiral/metrics.png", "benchmarks/tiny_metrics.png"),
                       ("runs/eval/tiny-comparison.png", "benchmarks/tiny_comparison.png")]:
        shutil.copyfile(os.path.join(ROOT, made), os.path.join(ROOT, kept))
    rows = {algo: checkpoint.read_metrics(os.path.join(ROOT, f"runs/tiny-{algo}/metrics.jsonl")) for algo in TRAIN}
    with open(os.path.join(ROOT, "runs/eval/tiny-comparison.json")) as f:
        result = json.load(f)
    v = checkpoint.versions("cpu")
    provenance = (f"Measured by `python benchmarks/reproduce.py` on {time.strftime('%Y-%m-%d')} ({v['device']}; "
                  f"Python {v['python']}, torch {v['torch']}, transformers {v['transformers']}, numpy {v['numpy']}, "
                  f"math-verify {v['math-verify']}): SPIRAL {len(rows['spiral'])} steps in "
                  f"{seconds['spiral'] / 60:.1f} min, GRPO in {seconds['grpo'] / 60:.1f} min, the evaluation in "
                  f"{seconds['evaluate']:.0f} s from an empty cache (each time includes loading; load average at "
                  f"the end {os.getloadavg()[1]:.1f} on {os.cpu_count()} cores: a busy machine is slower).")
    provenance = textwrap.fill(provenance, 116, break_on_hyphens=False)
    readme_path = os.path.join(ROOT, "README.md")
    with open(readme_path, encoding="utf-8") as f:
        readme = f.read()
    for name, content in [("demo", demo_table(rows["spiral"], rows["grpo"])), ("comparison", comparison_table(result)),
                          ("provenance", provenance)]:
        readme = replace_block(readme, name, content)
        print(f"\n{name}:\n{content}")
    with open(readme_path, "w", encoding="utf-8") as f:
        f.write(readme)
    print("\nreproduce.py: rewrote README.md's demo, comparison and provenance blocks, benchmarks/tiny_metrics.png "
          "and benchmarks/tiny_comparison.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
