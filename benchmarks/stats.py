"""The statistics of the benchmark tables, in plain Python (no scipy): Student's t distribution, Welch's and the
paired t-test over seeds, and the smallest difference a design detects.

    welch(a, b)    two-sided p of mean(a) = mean(b), unequal variances (Welch-Satterthwaite degrees of freedom)
    paired(a, b)   two-sided p of mean(a - b) = 0, seed by seed (the same seeds in both arms)
    detectable(a, b, power=0.8, alpha=0.05)
                   the smallest true difference Welch's test finds with probability `power` at level `alpha`, with
                   the arms' sample sds taken as the truth: (t_{1-alpha/2} + t_{power}) x se, df as Welch's

A cell whose headroom (the distance of the better arm to the ceiling, 1 for an accuracy) is below the detectable
difference cannot show that arm ahead whatever happens: the tables say "untestable at the ceiling" there.
"""

from __future__ import annotations

import math


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for x in [0, 1]."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_two_sided(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's T with df degrees of freedom."""
    return incomplete_beta(df / 2.0, 0.5, df / (df + t * t)) if math.isfinite(t) else 0.0


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p (0.5 < p < 1), by bisection on t_two_sided."""
    low, high = 0.0, 1e3
    for _ in range(200):
        mid = (low + high) / 2
        if 1.0 - t_two_sided(mid, df) / 2.0 < p:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def _mean_var(x: list[float]) -> tuple[float, float]:
    m = sum(x) / len(x)
    return m, sum((v - m) ** 2 for v in x) / (len(x) - 1)


def _welch_se_df(a: list[float], b: list[float]) -> tuple[float, float]:
    (_, va), (_, vb) = _mean_var(a), _mean_var(b)
    qa, qb = va / len(a), vb / len(b)
    se = math.sqrt(qa + qb)
    if se == 0.0:
        return 0.0, float(len(a) + len(b) - 2)
    return se, (qa + qb) ** 2 / (qa ** 2 / (len(a) - 1) + qb ** 2 / (len(b) - 1))


def welch(a: list[float], b: list[float]) -> float:
    """Welch's two-sided p for mean(a) = mean(b) (each arm at least 2 values). Two constant arms: 1 if they are
    equal, else 0."""
    se, df = _welch_se_df(a, b)
    diff = _mean_var(a)[0] - _mean_var(b)[0]
    if se == 0.0:
        return 1.0 if diff == 0 else 0.0
    return t_two_sided(diff / se, df)


def paired(a: list[float], b: list[float]) -> float:
    """The paired two-sided p for mean(a - b) = 0 over seeds (a[i] and b[i] share seed i)."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"paired needs two equally long lists of at least 2 values, got {len(a)} and {len(b)}")
    d = [x - y for x, y in zip(a, b)]
    m, v = _mean_var(d)
    if v == 0.0:
        return 1.0 if m == 0 else 0.0
    return t_two_sided(m / math.sqrt(v / len(d)), len(d) - 1)


def detectable(a: list[float], b: list[float], power: float = 0.8, alpha: float = 0.05) -> float:
    """The smallest difference of means Welch's test detects with probability `power` at level `alpha`."""
    se, df = _welch_se_df(a, b)
    return (t_quantile(1 - alpha / 2, df) + t_quantile(power, df)) * se


if __name__ == "__main__":  # a library: --help prints what it holds; nothing runs
    sys_argv = __import__("sys").argv
    print(__doc__) if sys_argv[1:] in (["-h"], ["--help"]) else print("stats.py: a library (--help)")
