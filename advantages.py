"""Advantages for SPIRAL's two levels (Section 3.2; Algorithm 1, lines 8-15), GRPO's, and the length rule.

For one prompt x: N1 search traces, K sets G_1..G_K of n of them (setsample.py), N2 aggregation traces per
set, and a reward r for each aggregation trace only.
  search traces       set RL: A#_marg(x, y_j) = mean of the set advantages A#(x, G) over the sets G holding y_j
  aggregation traces  standard RL: A(x, y^G_i) = r_i - mean of the rewards of the same set G
Groups run along the last axis; inputs are never written to; outputs are new float64 arrays. Wherever the
mathematics gives 0 (a group of equal values, a trace in every set or in none), the result is exactly 0.0,
so `advantage == 0` reliably means "no gradient". numpy only: copy this file into another trainer as it is.
flat_spiral_advantages and flat_group_advantages take a trainer's flat batch of rows (PORTING.md).
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


def marginal_set_advantages_by_definition(sets, set_advantages, num_traces):
    """Algorithm 1, line 13, as the paper writes it: A#_marg(x, y_j) = (1/|G(y_j)|) sum_{G in G(y_j)} A#(x, G),
    where G(y_j) holds the sampled sets that contain y_j; 0 for a trace in no set. The obvious loop, kept as the
    reference that marginal_set_advantages (the same thing, vectorised) is tested against."""
    adv_N1 = np.zeros(num_traces)
    for j in range(num_traces):
        adv_G = [set_advantages[l] for l, G_l in enumerate(sets) if j in list(G_l)]  # A#(x, G) for G in G(y_j)
        adv_N1[j] = sum(adv_G) / len(adv_G) if adv_G else 0.0
    return adv_N1


def marginal_set_advantages(sets, set_advantages, num_traces):
    """Algorithm 1, line 13 (eq. search_trace_set_rl_advantage): A#_marg(x, y_j) = mean_{G in G(y_j)} A#(x, G).

    marginal_set_advantages_by_definition, vectorised: |G(y_j)| and the sum over G(y_j) are two bincounts over the
    K n entries of `sets`. `sets` (K, n) holds trace indices in [0, num_traces), none repeated within a row;
    `set_advantages` (K,). Returns adv_N1. A trace in no set gets 0 (the factor 1{C_i > 0} in the proof of
    Proposition 3.1).
    """
    sets_K_n, adv_K = _checked_sets(sets, set_advantages, num_traces)
    K, n = sets_K_n.shape
    count_N1 = np.bincount(sets_K_n.ravel(), minlength=num_traces)  # |G(y_j)|, (N1,)
    total_N1 = np.bincount(sets_K_n.ravel(), weights=np.repeat(adv_K, n), minlength=num_traces)  # (N1,)
    adv_N1 = np.divide(total_N1, count_N1, out=np.zeros(num_traces), where=count_N1 > 0)  # (N1,)
    # Numerics, not mathematics: a trace in all K sets averages every centred A#, which is exactly 0, but the float
    # sum leaves ~1e-17; writing the 0 keeps "advantage == 0 means no gradient" true (module docstring).
    return np.where(count_N1 == K, 0.0, adv_N1)  # (N1,)


def _checked_sets(sets, set_advantages, num_traces):
    """(sets_K_n, adv_K) as arrays, or a ValueError saying which input is malformed."""
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
    return sets_K_n, adv_K


def aggregation_advantages(rewards):
    """Algorithm 1, line 15 (eq. final_trace_std_rl_advantage): A(x, y^{G_l}_i) = r_i - (1/N2) sum_k r_k.

    `rewards` (K, N2): row l holds set G_l's aggregation rewards; the baseline is the row's own mean, not the
    mean over all K N2 traces. Returns adv_K_N2.
    """
    return _centre("rewards", _floats("rewards", rewards, 2))  # (K, N2)


def spiral_advantages(sets_K_n, *, rewards_K_N2, N1):
    """Algorithm 1, lines 8-15 for one prompt: (adv_N1 for the search traces, adv_K_N2 for the aggregation traces).

    Line 8 scores each set by its mean aggregation reward, f_hat(x, G_l) = (1/N2) sum_i r(x, y^{G_l}_i);
    lines 10-13 give the search traces their marginal set advantage; line 15 centres each set's rewards.
    `sets_K_n` (K, n) and `rewards_K_N2` (K, N2): row l of both belongs to G_l; N1 search traces in all.
    rewards_K_N2 and N1 are keyword-only: at K = N2 (the paper's 4 and 4) a transposed (N2, K) array has the
    right shape and no check could tell, so the call names the axes: spiral_advantages(sets_K_n,
    rewards_K_N2=rewards_K_N2, N1=N1). Both outputs are float64, whatever the inputs' dtype.
    """
    rewards_K_N2 = _floats("rewards_K_N2", rewards_K_N2, 2)
    if np.ndim(sets_K_n) != 2 or len(sets_K_n) != rewards_K_N2.shape[0]:
        raise ValueError(f"rewards_K_N2 must have one row per set: sets_K_n has shape {np.shape(sets_K_n)}, "
                         f"rewards_K_N2 has shape {rewards_K_N2.shape} (an (N2, K) array transposed?)")
    scores_K = rewards_K_N2.mean(axis=1)  # f_hat_spiral(x, G_l), (K,)
    adv_N1 = marginal_set_advantages(sets_K_n, set_advantages(scores_K), N1)  # (N1,)
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


# ----------------------------------------------------------------------------------------------------------------------
# Line 13 under a perfect selector: pass@n policy optimisation (PKPO: Walder & Karkhanis 2025, arXiv 2505.15201).
# An aggregator that always picks the best candidate scores a set by f_hat(x, G) = max_{y in G} r(x, y). With every
# one of the C(N1, n) sets (K -> all), line 13 is then PKPO's pass@n objective: for r in {0, 1} with c of N1 right,
#     A#_marg(y_j) = 1 - rho(N1, c, n)                              y_j right
#                  = rho(N1 - 1, c, n - 1) - rho(N1, c, n)          y_j wrong
# where rho(N, c, k) = 1 - C(N - c, k) / C(N, k) is the unbiased pass@k estimate. So set RL stops pushing a trace once
# every set holding it is right, and gives a wrong trace credit when its sets are right anyway.


def oracle_set_scores(sets, rewards):
    """f_hat(x, G_l) of a perfect-selector aggregator: max_{y in G_l} r(x, y). sets_K_n, rewards_N1 -> scores_K.

    Line 8 without aggregation traces (train.py --aggregator oracle): what line 13 does to search traces alone.
    """
    rewards_N1 = _floats("rewards", rewards, 1)
    sets_K_n, _ = _checked_sets(sets, np.zeros(len(sets)), len(rewards_N1))
    return rewards_N1[sets_K_n].max(axis=1)  # (K,)


def _comb(n, k):
    """C(n, k) as an exact Python int, 0 when k > n (the standard library's math.comb; this file imports numpy only)."""
    if not 0 <= k <= n:
        return 0
    out = 1
    for i in range(min(k, n - k)):
        out = out * (n - i) // (i + 1)
    return out


def pass_at_k_estimate(num_traces, num_correct, k):
    """rho(N, c, k) = 1 - C(N - c, k) / C(N, k): the unbiased pass@k estimate from c right of N (Chen et al. 2021)."""
    return 1.0 - _comb(num_traces - num_correct, k) / _comb(num_traces, k)


def pass_at_n_advantages(rewards, set_size):
    """Line 13 over all C(N1, n) sets with the perfect selector, in closed form (no set is enumerated):

        A#_marg(y_j) = mean_{G ∋ y_j} max_G r  -  mean_G max_G r            (rewards_N1 in [0, 1] -> adv_N1)

    Over rewards sorted ascending, the largest of a uniformly drawn n-set is the i-th smallest (0-based) with
    probability C(i, n-1) / C(N, n); for the sets holding y_j, max(r_j, the largest of n-1 others drawn from N-1).
    For r in {0, 1} this is the identity in the comment above (tests check both against enumeration).
    """
    rewards_N1 = _floats("rewards", rewards, 1)
    N, n = len(rewards_N1), set_size
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= N:
        raise ValueError(f"set_size must be an integer in [1, {N}], got {set_size!r}")
    if n == N or np.all(rewards_N1 == rewards_N1[0]):
        return np.zeros(N)  # every set is the same, or scores the same: exactly no gradient
    sorted_N1 = np.sort(rewards_N1)
    mean_max = float(sorted_N1 @ np.array([float(_comb(i, n - 1)) for i in range(N)])) / _comb(N, n)  # mean_G max_G r
    if n == 1:
        return rewards_N1 - mean_max
    weights = np.array([float(_comb(i, n - 2)) for i in range(N - 1)]) / _comb(N - 1, n - 1)  # (N1 - 1,)
    adv_N1 = np.empty(N)
    for j in range(N):
        others = np.sort(np.delete(rewards_N1, j))  # (N-1,)
        adv_N1[j] = float(np.maximum(others, rewards_N1[j]) @ weights) - mean_max
    return adv_N1


# ----------------------------------------------------------------------------------------------------------------------
# A trainer's flat batch (verl, TRL): bookkeeping around the per-prompt functions above, no new mathematics.


def _column(name, values, num_rows, ndim=1):
    """`values` as a float64 array with `num_rows` rows (fields that do not apply may hold -1 or NaN)."""
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must hold numbers (-1 or NaN where a field does not apply)") from None
    if array.ndim != ndim or array.shape[0] != num_rows:
        shape = "(R,)" if ndim == 1 else "(R, n)"
        raise ValueError(f"{name} must have shape {shape} with R = {num_rows} rows, got shape {array.shape}")
    return array


def _flags(name, values, num_rows):
    array = np.asarray(values)
    if array.dtype == object:  # verl's non_tensor_batch holds object arrays
        array = np.array(array.tolist())
    zero_one = array.dtype.kind in "iu" and np.all((array == 0) | (array == 1))
    if array.shape != (num_rows,) or not (array.dtype == bool or array.size == 0 or zero_one):
        raise ValueError(f"{name} must be {num_rows} booleans, got dtype {array.dtype} and shape {array.shape}")
    return array.astype(bool)


def _rows_by_prompt(prompt_ids):
    """{prompt id: [row, ...]} in order of first appearance."""
    groups = {}
    for row, pid in enumerate(prompt_ids):
        try:
            groups.setdefault(pid, []).append(row)
        except TypeError:
            raise ValueError(f"prompt_ids must be hashable, row {row} holds {type(pid).__name__}") from None
    return groups


def _whole(pid, name, values):
    """Whole numbers >= 0 as int64, else a ValueError naming the prompt."""
    if not np.all(np.isfinite(values) & (values >= 0) & (values == np.floor(values))):
        raise ValueError(f"prompt {pid}: {name} must be whole numbers >= 0, got {values.ravel()[:8].tolist()}")
    return values.astype(np.int64)


def flat_spiral_advantages(prompt_ids, is_search, trace_index, set_index, set_members, rewards):
    """spiral_advantages (Algorithm 1, lines 8-15) for a trainer's flat batch of R rows, in any order.

    Bookkeeping only: it rebuilds each prompt's sets_K_n and rewards_K_N2 from its rows and calls
    spiral_advantages. Row contract (one entry per row; a field that does not apply may hold -1 or NaN):
      prompt_ids (R,)      any hashable group key (verl's uid)
      is_search (R,)       bool: a search trace (set RL) or an aggregation trace (standard RL)
      trace_index (R,)     search rows: j in 0..N1-1, each once per prompt
      set_index (R,)       aggregation rows: l in 0..K-1, every set with the same number N2 of rows
      set_members (R, n)   aggregation rows: the search-trace indices of set l, identical on all of its rows
      rewards (R,)         aggregation rows: r(x, y); search rows are never rewarded
    Returns adv_R (float64). Inconsistent metadata is a ValueError naming the prompt. Within a set, rows are taken
    in order of reward, so the result does not change, bit for bit, when rows are reordered.
    """
    num_rows = len(prompt_ids)
    search_R = _flags("is_search", is_search, num_rows)
    trace_R, set_R, rewards_R = (_column(name, v, num_rows) for name, v in
                                 [("trace_index", trace_index), ("set_index", set_index), ("rewards", rewards)])
    members_R_n = _column("set_members", set_members, num_rows, ndim=2)
    adv_R = np.zeros(num_rows)
    for pid, rows in _rows_by_prompt(prompt_ids).items():
        search, aggregation = [np.array([r for r in rows if search_R[r] == s], dtype=np.int64) for s in (1, 0)]
        if len(search) == 0 or len(aggregation) == 0:
            raise ValueError(f"prompt {pid}: has {len(search)} search rows and {len(aggregation)} aggregation "
                             "rows; it needs both")
        j_S = _whole(pid, "trace_index on search rows", trace_R[search])
        N1 = len(search)
        if not np.array_equal(np.sort(j_S), np.arange(N1)):
            missing = sorted(set(range(int(j_S.max()) + 1)) - set(j_S.tolist()))
            raise ValueError(f"prompt {pid}: the trace_index of its {N1} search rows must be 0..{N1 - 1} once each, "
                             f"got {sorted(j_S.tolist())}" + (f" (missing search rows {missing})" if missing else ""))
        l_A = _whole(pid, "set_index on aggregation rows", set_R[aggregation])
        members_A_n = _whole(pid, "set_members on aggregation rows", members_R_n[aggregation])
        K = int(l_A.max()) + 1
        rows_K = [aggregation[l_A == l] for l in range(K)]
        sizes = [len(rows_l) for rows_l in rows_K]
        if min(sizes) == 0 or len(set(sizes)) > 1:
            raise ValueError(f"prompt {pid}: sets 0..{K - 1} must have equally many aggregation rows (N2), got "
                             f"{dict(enumerate(sizes))} rows by set_index")
        for l in range(K):
            if np.any(members_A_n[l_A == l] != members_A_n[l_A == l][0]):
                raise ValueError(f"prompt {pid}: the rows of set {l} disagree on its members: "
                                 f"{np.unique(members_A_n[l_A == l], axis=0).tolist()}")
        if members_A_n.max() >= N1:
            raise ValueError(f"prompt {pid}: a set holds search trace {members_A_n.max()}, but the prompt has "
                             f"search rows only for traces 0..{N1 - 1} (missing search rows)")
        sets_K_n = np.stack([members_A_n[l_A == l][0] for l in range(K)])  # (K, n)
        if not np.all(np.isfinite(rewards_R[aggregation])):
            raise ValueError(f"prompt {pid}: an aggregation row has reward "
                             f"{rewards_R[aggregation][~np.isfinite(rewards_R[aggregation])][0]}")
        # Row order within a set is arbitrary; ordering by reward makes every float sum the same for any order.
        grid_K_N2 = np.stack([rows_l[np.argsort(rewards_R[rows_l], kind="stable")] for rows_l in rows_K])  # rows
        try:
            adv_N1, adv_K_N2 = spiral_advantages(sets_K_n, rewards_K_N2=rewards_R[grid_K_N2], N1=N1)
        except ValueError as exc:
            raise ValueError(f"prompt {pid}: {exc}") from None
        adv_R[search] = adv_N1[j_S]
        adv_R[grid_K_N2] = adv_K_N2
    return adv_R


def flat_group_advantages(prompt_ids, rewards, normalize_std=False):
    """group_advantages (GRPO) for a flat batch: each prompt's rows form one group, in any order and of any size.

    Returns adv_R (float64); a non-finite reward is a ValueError naming the prompt. Rows are taken in order of
    reward within a group, so the result does not change, bit for bit, when rows are reordered.
    """
    rewards_R = _column("rewards", rewards, len(prompt_ids))
    adv_R = np.zeros(len(rewards_R))
    for pid, rows in _rows_by_prompt(prompt_ids).items():
        rows = np.array(rows)
        if not np.all(np.isfinite(rewards_R[rows])):
            raise ValueError(f"prompt {pid}: a row has reward {rewards_R[rows][~np.isfinite(rewards_R[rows])][0]}")
        rows = rows[np.argsort(rewards_R[rows], kind="stable")]
        adv_R[rows] = group_advantages(rewards_R[rows], normalize_std)
    return adv_R


if __name__ == "__main__":  # a library: prints what it holds, runs nothing (copied alone, it imports numpy only)
    print(__doc__)
