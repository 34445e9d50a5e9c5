"""Advantages for SPIRAL's two levels (Section 3.2; Algorithm 1, lines 8-15), GRPO's, and the length rule.

For one prompt x: N1 search traces, K sets G_1..G_K of n of them (setsample.py), N2 aggregation traces per
set, and a reward r for each aggregation trace only.
  search traces       set RL: A#_marg(x, y_j) = mean of the set advantages A#(x, G) over the sets G holding y_j
  aggregation traces  standard RL: A(x, y^G_i) = r_i - mean of the rewards of the same set G
Groups run along the last axis; inputs are never written to; outputs are new float64 arrays. Wherever the
mathematics gives 0 (a group of equal values, a trace in every set or in none), the result is exactly 0.0,
so `advantage == 0` reliably means "no gradient". numpy only: copy this file into another trainer as it is.
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
    return np.where(constant, 0.0, x - x.mean(axis=-1, keepdims=True))  # why: a rounded mean leaves 1e-17


def set_advantages(set_scores):
    """Algorithm 1, lines 10-11: A#(x, G_l) = f_hat(x, G_l) - (1/K) sum_l' f_hat(x, G_l'). (K,) -> adv_K."""
    return _centre("set_scores", _floats("set_scores", set_scores, 1))  # (K,)


def marginal_set_advantages(sets, set_advantages, num_traces):
    """Algorithm 1, line 13 (eq. search_trace_set_rl_advantage): A#_marg(x, y_j) = mean_{G in G(y_j)} A#(x, G).

    `sets` (K, n) holds trace indices in [0, num_traces), none repeated within a row; `set_advantages` (K,).
    Returns adv_N1. A trace in no set gets 0 (the factor 1{C_i > 0} in the proof of Proposition 3.1).
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
    total_N1 = np.bincount(sets_K_n.ravel(), weights=np.repeat(adv_K, n), minlength=num_traces)  # (N1,)
    adv_N1 = np.divide(total_N1, count_N1, out=np.zeros(num_traces), where=count_N1 > 0)  # (N1,)
    # A trace in all K sets averages every centred A#: exactly 0, though the float sum leaves ~1e-17.
    return np.where(count_N1 == K, 0.0, adv_N1)  # (N1,)


def aggregation_advantages(rewards):
    """Algorithm 1, line 15 (eq. final_trace_std_rl_advantage): A(x, y^{G_l}_i) = r_i - (1/N2) sum_k r_k.

    `rewards` (K, N2): row l holds set G_l's aggregation rewards; the baseline is the row's own mean, not the
    mean over all K N2 traces. Returns adv_K_N2.
    """
    return _centre("rewards", _floats("rewards", rewards, 2))  # (K, N2)


def spiral_advantages(sets, aggregation_rewards, num_traces):
    """Algorithm 1, lines 8-15 for one prompt: (adv_N1 for the search traces, adv_K_N2 for the aggregation traces).

    Line 8 scores each set by its mean aggregation reward, f_hat(x, G_l) = (1/N2) sum_i r(x, y^{G_l}_i);
    lines 10-13 give the search traces their marginal set advantage; line 15 centres each set's rewards.
    `sets` (K, n) and `aggregation_rewards` (K, N2): row l of both belongs to G_l.
    """
    rewards_K_N2 = _floats("aggregation_rewards", aggregation_rewards, 2)
    if np.ndim(sets) != 2 or len(sets) != rewards_K_N2.shape[0]:
        raise ValueError(f"aggregation_rewards must have one row per set: sets has shape "
                         f"{np.shape(sets)}, aggregation_rewards has shape {rewards_K_N2.shape}")
    scores_K = rewards_K_N2.mean(axis=1)  # f_hat_spiral(x, G_l), (K,)
    adv_N1 = marginal_set_advantages(sets, set_advantages(scores_K), num_traces)  # (N1,)
    return adv_N1, aggregation_advantages(rewards_K_N2)


def group_advantages(rewards, normalize_std=False):
    """GRPO, the paper's baseline: A_i = r_i - mean_j r_j (Dr. GRPO), or divided by the group's std.

    `rewards` (..., G): groups along the last axis. normalize_std uses the population std (ddof=0); TRL uses
    ddof=1 plus 1e-4. Equal rewards give exact zeros, never NaN.
    """
    centred_B_G = _centre("rewards", _floats("rewards", rewards))
    if not normalize_std:
        return centred_B_G
    std_B_1 = np.sqrt(np.mean(centred_B_G ** 2, axis=-1, keepdims=True))  # 0 exactly for equal groups
    return np.divide(centred_B_G, std_B_1, out=np.zeros_like(centred_B_G), where=std_B_1 > 0)


def length_aware(advantages, lengths, target_length):
    """Appendix, eq. length-aware-advantage: A -> 0 where A > 0 and L > L_target; otherwise A unchanged.

    Long correct answers are not reinforced; long wrong ones are still penalised. L == L_target keeps A (the
    paper leaves it open). `lengths` (tokens) has the shape of `advantages`.
    """
    adv = _floats("advantages", advantages)
    lengths = np.asarray(lengths)
    if lengths.shape != adv.shape:
        raise ValueError(f"lengths must have the shape of advantages {adv.shape}, got {lengths.shape}")
    if isinstance(target_length, bool) or not isinstance(target_length, (int, float, np.number)):
        raise ValueError(f"target_length must be a number, got {target_length!r}")
    return np.where((adv > 0) & (lengths > target_length), 0.0, adv)
