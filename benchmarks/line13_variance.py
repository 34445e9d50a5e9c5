"""How much noise does sampling K of the C(N1, n) sets add to line 13? Measured under the perfect selector.

For N1 = 8 search traces with c right ones (c = 1..7; r in {0, 1}) and sets of n = 4, the marginal set advantage
A#_marg(y_j) of line 13 is computed over K sets drawn as SPIRAL draws them (setsample.sample_sets), `--draws` times
per K, and compared with its K -> all limit, PKPO's pass@n advantage A_all (advantages.pass_at_n_advantages). By
Proposition 3.1 its mean is (M_K / M_all) A_all; the columns say how far one draw strays from that:

    E[A_K] / A_all            measured scale, against M_K / M_all (setsample.gradient_scale)
    traces in no set          1 - q_K: they get advantage 0 whatever they are
    noise / signal            sqrt(mean_j Var A_K(y_j)) / sqrt(mean_j E[A_K(y_j)]^2), mean over c
    wrong sign                share of (draw, trace) pairs whose A_K has the opposite sign of A_all (traces with
                              A_all != 0), mean over c
    zero                      share of those pairs with A_K = 0 (no set holding the trace, or its sets all alike)

    python benchmarks/line13_variance.py                       # the table (a few seconds)
    python benchmarks/line13_variance.py --out benchmarks/line13_variance.md
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from advantages import marginal_set_advantages, oracle_set_scores, pass_at_n_advantages, set_advantages  # noqa: E402
from setsample import all_sets, count_possible_sets, coverage_probability, gradient_scale, sample_sets  # noqa: E402

N1, N = 8, 4
KS = (2, 4, 8, 16, "all")


def measure(K, c: int, draws: int, rng: np.random.Generator) -> dict:
    """One K and one c: the four columns' raw figures over `draws` draws of K sets."""
    rewards = np.array([1.0] * c + [0.0] * (N1 - c))
    exact = pass_at_n_advantages(rewards, N)  # (N1,)
    sets_draws = [all_sets(N1, N)] if K == "all" else [sample_sets(N1, N, K, rng=rng) for _ in range(draws)]
    adv = np.array([marginal_set_advantages(s, set_advantages(oracle_set_scores(s, rewards)), N1)
                    for s in sets_draws])  # (draws, N1)
    mean, var = adv.mean(0), adv.var(0)
    nonzero = exact != 0
    return {"scale": float(mean[nonzero] @ exact[nonzero] / (exact[nonzero] @ exact[nonzero])) if nonzero.any()
            else None,
            "noise_signal": float(np.sqrt(var.mean()) / np.sqrt((mean ** 2).mean())) if np.any(mean) else None,
            "wrong_sign": float(np.mean(np.sign(adv[:, nonzero]) == -np.sign(exact[nonzero]))) if nonzero.any()
            else None,
            "zero": float(np.mean(adv[:, nonzero] == 0)) if nonzero.any() else None}


def table(draws: int, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    total = count_possible_sets(N1, N)
    lines = [f"| K (of C({N1}, {N}) = {total}) | M_K / M_all | E[A_K] / A_all, measured | traces in no set | "
             "noise / signal | wrong sign | zero |", "|---|---|---|---|---|---|---|"]
    for K in KS:
        k = total if K == "all" else K
        rows = [measure(K, c, draws, rng) for c in range(1, N1)]
        rows = [r for r in rows if r["scale"] is not None]  # c >= N1 - N + 1: every set is right, A_all = 0
        ratio = gradient_scale(N1, N, k) / gradient_scale(N1, N, total)
        lines.append(f"| {K} | {ratio:.3f} | {np.mean([r['scale'] for r in rows]):.3f} | "
                     f"{1 - coverage_probability(N1, N, k):.3f} | {np.mean([r['noise_signal'] for r in rows]):.2f} | "
                     f"{np.mean([r['wrong_sign'] for r in rows]):.3f} | {np.mean([r['zero'] for r in rows]):.3f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="line13_variance.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=20000, help="draws of K sets per K and c (default 20000)")
    parser.add_argument("--out", help="also write the table to this Markdown file")
    args = parser.parse_args(argv)
    if args.draws < 2:
        print("line13_variance.py: error: --draws must be at least 2", file=sys.stderr)
        return 2
    text = (f"<!-- written by benchmarks/line13_variance.py --draws {args.draws} -->\n"
            f"Line 13 under the perfect selector, N1 = {N1}, n = {N}, c = 1..{N1 - N} right traces (larger c: every "
            f"set is right and A_all = 0), {args.draws} draws of K sets each:\n\n" + table(args.draws) + "\n")
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
