"""The demo's fingerprint: the first steps of `python train.py --preset tiny`, run as a user runs it, give exactly
these numbers on constraints.txt's versions, so a drift (a new transformers, a changed sampler) fails CI instead of
surprising a user who compares with the README. The same run's output holds no library noise and ends with the
README's table.

After an intended change (a new pin, a change to sampling or training), print the new fingerprint with
    python tests/test_fingerprint.py
paste it over EXPECTED below, and regenerate the README's figures and tables with `python benchmarks/reproduce.py`.
"""

import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 2
COMMAND = ["train.py", "--preset", "tiny", "--steps", str(STEPS), "--no-plot"]

# The fingerprint (the one place to update): per step, counts exactly, accuracies exactly (fractions of traces),
# the gradient norm to 3 significant digits (float sums may differ in the last bits between CPUs).
EXPECTED = [
    {"step": 1, "problems_drawn": 10, "problems_kept": 8, "search_accuracy": 0.3, "aggregation_accuracy": 0.33125,
     "tokens_generated": 1921, "train/samples_trained": 136, "train/tokens_trained": 7449,
     "train/grad_norm": 0.0115},
    {"step": 2, "problems_drawn": 10, "problems_kept": 8, "search_accuracy": 0.3125, "aggregation_accuracy": 0.4125,
     "tokens_generated": 1920, "train/samples_trained": 123, "train/tokens_trained": 6734,
     "train/grad_norm": 0.0116},
]

# Our own lines: train.py's notices, its progress bar ("spiral: ..."), and the closing table.
OURS = re.compile(r"train\.py: .*|spiral: .*|\|.*\||")
def fingerprint(rows: list[dict]) -> list[dict]:
    return [{k: float(f"{row[k]:.3g}") if k == "train/grad_norm" else row[k] for k in EXPECTED[0]} for row in rows]


def run_demo(out: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "default"}  # show every warning a user would see
    return subprocess.run([sys.executable, *COMMAND, "--out", out], cwd=ROOT, capture_output=True, text=True, env=env,
                          timeout=600)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("fingerprint") / "run")
    done = run_demo(out)
    assert done.returncode == 0, done.stderr[-2000:]
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return done, [json.loads(line) for line in f]


def test_the_demo_s_first_steps_are_the_pinned_fingerprint(demo):
    _, rows = demo
    assert fingerprint(rows) == EXPECTED, ("the demo drifted from its fingerprint; if intended, run `python "
                                           "tests/test_fingerprint.py` and `python benchmarks/reproduce.py`")


def test_the_demo_prints_no_library_noise_and_ends_with_the_readme_table(demo):
    done, _ = demo
    lines = [part.strip() for part in re.split(r"[\r\n]", done.stdout + done.stderr)]
    noise = [line for line in lines if not OURS.fullmatch(line)]
    assert noise == [], noise[:5]
    assert "Loading weights" not in done.stdout + done.stderr
    assert any("aggregation acc" in line for line in lines)  # the bar names the accuracy it shows
    table = done.stdout.strip().splitlines()[-5:]
    assert table[0].startswith("| mean over | first 10% of steps (1-1) | last 10% of steps (2-2) |")
    first, last = EXPECTED[0]["aggregation_accuracy"], EXPECTED[-1]["aggregation_accuracy"]
    assert table[3] == f"| aggregation accuracy | {first:.2f} | {last:.2f} |"


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        result = run_demo(os.path.join(tmp, "run"))
        if result.returncode:
            sys.exit(result.stderr)
        with open(os.path.join(tmp, "run", "metrics.jsonl")) as f:
            print("EXPECTED = [\n" + "".join(f"    {row},\n" for row in fingerprint([json.loads(x) for x in f])) + "]")
