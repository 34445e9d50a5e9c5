"""Advantages for SPIRAL's two levels of generation (Section 3.2 and Algorithm 1, lines 8-15).

For one prompt x, SPIRAL has N1 search traces y_1..y_N1, K sampled sets G_1..G_K of n search traces each
(setsample.py), and N2 aggregation traces y^{G_l}_1..y^{G_l}_N2 per set, each with a reward r. Only
aggregation traces are rewarded. The two levels get two kinds of advantage:

- search traces: set RL. Each set is scored by its mean aggregation reward, the set advantage A# is that
  score minus the mean score over the K sets, and each search trace gets the mean A# of the sets that
  contain it (the marginal set advantage, eq. search_trace_set_rl_advantage).
- aggregation traces: standard RL with a per-set baseline (eq. final_trace_std_rl_advantage).

Also here: the GRPO baseline the paper compares against, and the appendix's length-aware rule
(eq. length-aware-advantage). Every function takes numpy arrays or plain lists, returns new float64
arrays and never writes into its inputs. Groups always run along the last axis. A group whose values are
all equal gets exact zeros, not 1e-17 leftovers from a rounded mean, so "advantage == 0" tests work.
Only numpy is imported.

Algorithm 1's line numbers count every line it prints, the comment lines and "end for" included, as
the LaTeX algorithmic package numbers them: line 8 scores a set, line 13 is the marginal set advantage.
"""

import numpy as np


def _floats(name, values, ndim=None):
    """`values` as a finite float64 array, with `ndim` dimensions unless ndim is None."""
    array = np.asarray(values, dtype=np.float64)
    if ndim is not None and array.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be finite, got {np.sum(~np.isfinite(array))} NaN/inf values")
    return array


def _centre(name, x):
    """x minus the mean of its group (last axis); groups of equal values get exact zeros."""
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ValueError(f"{name} needs at least one value per group, got shape {x.shape}")
    constant = np.all(x == x[..., :1], axis=-1, keepdims=True)
    return np.where(constant, 0.0, x - x.mean(axis=-1, keepdims=True))


def set_advantages(set_scores):
    """A#(x, G_l) = f^(x, G_l) - (1/K) sum_{l'} f^(x, G_l'): Algorithm 1, lines 10-11.

    `set_scores` has shape (K,), one score f^(x, G_l) per sampled set. Returns adv_K.
    """
    return _centre("set_scores", _floats("set_scores", set_scores, 1))  # (K,)


def marginal_set_advantages(sets, set_advantages, num_traces):
    """A#_marg(x, y_j) = (1/|G(y_j)|) sum_{G in G(y_j)} A#(x, G): eq. search_trace_set_rl_advantage
    and Algorithm 1, line 13.

    `sets` (K, n) holds trace indices in [0, num_traces) with no repeat within a row (setsample's
    sets_K_n). `set_advantages` (K,) holds A#(x, G_l). Returns adv_N1, of shape (num_traces,).

    A trace in no sampled set (G(y_j) empty) gets 0, so it contributes no gradient. The proof of
    Proposition 3.1 uses this convention (its factor 1{C_i > 0}), and it makes M = (N/n) q_K - 1 the
    exact scale of the estimator. With N1=8, n=4, K=4 a trace is left out with probability
    1 - q_K = 88/1541 = 5.7%.
    """
    sets_K_n = np.asarray(sets)
    adv_K = _floats("set_advantages", set_advantages, 1)
    if isinstance(num_traces, bool) or not isinstance(num_traces, (int, np.integer)) or num_traces < 1:
        raise ValueError(f"num_traces must be a positive integer, got {num_traces!r}")
    if sets_K_n.ndim != 2 or sets_K_n.shape[0] != adv_K.shape[0] or 0 in sets_K_n.shape:
        raise ValueError(f"sets must have shape (K, n) with K = len(set_advantages) = {adv_K.shape[0]} "
                         f">= 1 and n >= 1, got shape {sets_K_n.shape}")
    if sets_K_n.dtype.kind not in "iu":
        raise ValueError(f"sets must hold integer trace indices, got dtype {sets_K_n.dtype}")
    if sets_K_n.min() < 0 or sets_K_n.max() >= num_traces:
        raise ValueError(f"sets must hold indices in [0, {num_traces}), got values from "
                         f"{sets_K_n.min()} to {sets_K_n.max()}")
    if np.any(np.diff(np.sort(sets_K_n, axis=1), axis=1) == 0):
        raise ValueError(f"a set repeats a trace index: {sets_K_n.tolist()}")
    K, n = sets_K_n.shape
    count_N1 = np.bincount(sets_K_n.ravel(), minlength=num_traces)  # |G(y_j)|, (N1,)
    total_N1 = np.bincount(sets_K_n.ravel(), weights=np.repeat(adv_K, n), minlength=num_traces)
    return np.divide(total_N1, count_N1, out=np.zeros(num_traces), where=count_N1 > 0)  # (N1,)


def aggregation_advantages(rewards):
    """A(x, y^{G_l}_j) = r(x, y^{G_l}_j) - (1/N2) sum_k r(x, y^{G_l}_k): eq. final_trace_std_rl_advantage
    and Algorithm 1, line 15.

    `rewards` has shape (K, N2): row l holds the rewards of set G_l's aggregation traces. The baseline is
    the mean of the row's own N2 rewards, not of all K N2 rewards. Returns adv_K_N2.
    """
    return _centre("rewards", _floats("rewards", rewards, 2))  # (K, N2)


def spiral_advantages(sets, aggregation_rewards, num_traces):
    """Both levels of advantage for one prompt: Algorithm 1, lines 8-15 (given the rewards).

    Set scores are the mean aggregation reward per set, f^_spiral(x, G_l) = (1/N2) sum_i r(x, y^{G_l}_i)
    (line 8). Then come the set advantages (lines 10-11) and the marginal set advantage of each search
    trace (line 13). The aggregation traces get their per-set centred rewards (line 15).
    `sets` is (K, n), `aggregation_rewards` is (K, N2), with row l of both belonging to G_l.
    Returns (adv_N1 of shape (num_traces,), adv_K_N2 of shape (K, N2)).
    """
    rewards_K_N2 = _floats("aggregation_rewards", aggregation_rewards, 2)
    if np.ndim(sets) != 2 or len(sets) != rewards_K_N2.shape[0]:
        raise ValueError(f"aggregation_rewards must have one row per set: sets has shape "
                         f"{np.shape(sets)}, aggregation_rewards has shape {rewards_K_N2.shape}")
    scores_K = rewards_K_N2.mean(axis=1)  # f^_spiral(x, G_l), (K,)
    adv_N1 = marginal_set_advantages(sets, set_advantages(scores_K), num_traces)  # (N1,)
    return adv_N1, aggregation_advantages(rewards_K_N2)


def group_advantages(rewards, normalize_std=False):
    """GRPO's advantage, the paper's baseline: r_i - mean(r), optionally divided by std(r).

    `rewards` is (G,) for one group, or (B, G) for B groups of G generations (any leading shape works;
    groups run along the last axis). The division by the std is off by default, as in Dr. GRPO.
    normalize_std=True divides by the group's std, as DeepSeekMath's GRPO does, using the population std
    (ddof=0). TRL uses torch's default ddof=1 (plus 1e-4), so its advantages are smaller by about
    sqrt((G-1)/G). A group whose rewards are all equal gets zeros, never NaN.
    """
    centred_B_G = _centre("rewards", _floats("rewards", rewards))
    if not normalize_std:
        return centred_B_G
    std_B_1 = np.sqrt(np.mean(centred_B_G ** 2, axis=-1, keepdims=True))  # 0 exactly for equal groups
    return np.divide(centred_B_G, std_B_1, out=np.zeros_like(centred_B_G), where=std_B_1 > 0)


def length_aware(advantages, lengths, target_length):
    """The appendix's length-aware advantage (eq. length-aware-advantage):

        A_modified(x, y) = 0        if A(x, y) > 0 and L > L_target,
                           A(x, y)  otherwise.

    A positive advantage of a generation longer than the target is dropped: long correct answers are
    not reinforced, long wrong ones are still penalised. The paper leaves L == L_target open. Here it
    keeps its advantage, because only L > L_target is zeroed. `lengths` (in tokens) has the shape of
    `advantages` (any shape). Returns a new float64 array.
    """
    adv = _floats("advantages", advantages)
    lengths = np.asarray(lengths)
    if lengths.shape != adv.shape:
        raise ValueError(f"lengths must have the shape of advantages {adv.shape}, got {lengths.shape}")
    if isinstance(target_length, bool) or not isinstance(target_length, (int, float, np.number)):
        raise ValueError(f"target_length must be a number, got {target_length!r}")
    return np.where((adv > 0) & (lengths > target_length), 0.0, adv)
