"""advantages.flat_spiral_advantages and flat_group_advantages: a trainer's flat, shuffled batch of rows gives, row by
row, what the per-prompt functions give each prompt; and every kind of inconsistent metadata is a ValueError that
names the prompt."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from advantages import flat_group_advantages, flat_spiral_advantages, group_advantages, spiral_advantages
from setsample import sample_sets

FIELDS = ("prompt_ids", "is_search", "trace_index", "set_index", "set_members", "rewards")


def rows_of(prompts, rng, filler=-1):
    """Flatten [(pid, sets_K_n, rewards_K_N2, N1)] into the row contract's columns, then shuffle the rows.

    Fields that do not apply hold `filler` (or, with filler=None, a random mix of -1 and NaN). Returns
    (columns dict, a list of (pid, kind, index) per row saying which trace each row is)."""
    n = prompts[0][1].shape[1]
    rows = []
    for pid, sets_K_n, rewards_K_N2, N1 in prompts:
        for j in range(N1):
            rows.append((pid, True, j, None, None, None, ("search", j)))
        for l, (G_l, rewards_N2) in enumerate(zip(sets_K_n, rewards_K_N2)):
            for i, r in enumerate(rewards_N2):
                rows.append((pid, False, None, l, G_l.tolist(), r, ("aggregation", l, i)))
    order = rng.permutation(len(rows))
    rows = [rows[k] for k in order]

    def fill(value, width=None):
        if value is not None:
            return value
        f = filler if filler is not None else (-1 if rng.random() < 0.5 else math.nan)
        return [f] * width if width else f

    columns = {
        "prompt_ids": np.array([r[0] for r in rows], dtype=object),
        "is_search": np.array([r[1] for r in rows]),
        "trace_index": np.array([fill(r[2]) for r in rows], dtype=float),
        "set_index": np.array([fill(r[3]) for r in rows], dtype=float),
        "set_members": np.array([fill(r[4], n) for r in rows], dtype=float).reshape(len(rows), n),
        "rewards": np.array([fill(r[5]) for r in rows], dtype=float),
    }
    for array in columns.values():
        array.flags.writeable = False  # any write into an input raises
    return columns, [(r[0],) + r[6] for r in rows]


@st.composite
def batches(draw):
    """1-4 prompts sharing n, each with its own N1, K, N2 and reward kind; uids are strings or ints."""
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    n = draw(st.integers(1, 4))
    prompts = []
    for p in range(draw(st.integers(1, 4))):
        N1 = draw(st.integers(n, 8))
        K = draw(st.integers(1, min(math.comb(N1, n), 6)))
        N2 = draw(st.integers(1, 4))
        kind = draw(st.sampled_from(["binary", "gaussian", "tenths"]))
        rewards = {"binary": lambda: rng.integers(0, 2, (K, N2)).astype(float),
                   "gaussian": lambda: rng.normal(size=(K, N2)),
                   "tenths": lambda: np.where(rng.random((K, N2)) < 0.7, 0.1, 0.3)}[kind]()
        pid = f"uid-{p}" if draw(st.booleans()) else 100 + p
        prompts.append((pid, sample_sets(N1, n, K, ordered=draw(st.booleans()), rng=rng), rewards, N1))
    return prompts, rng, draw(st.sampled_from([-1, None]))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(batches())
def test_flat_equals_the_per_prompt_function_on_shuffled_rows(batch):
    prompts, rng, filler = batch
    columns, which = rows_of(prompts, rng, filler)
    adv_R = flat_spiral_advantages(**columns)
    assert adv_R.dtype == np.float64 and adv_R.shape == (len(which),)

    for pid, sets_K_n, rewards_K_N2, N1 in prompts:
        # Exact, against the per-prompt function given each set's rewards in order of reward (what the flat
        # function does, so that float sums do not depend on row order).
        sorted_K_N2 = np.sort(rewards_K_N2, axis=1)
        search_N1, agg_K_N2 = spiral_advantages(sets_K_n, rewards_K_N2=sorted_K_N2, N1=N1)
        # And to 1e-12, with the same exact zeros for 0/1 rewards, against the natural call.
        plain_N1, plain_K_N2 = spiral_advantages(sets_K_n, rewards_K_N2=rewards_K_N2, N1=N1)
        for row, w in enumerate(which):
            if w[0] != pid:
                continue
            if w[1] == "search":
                expected, plain = search_N1[w[2]], plain_N1[w[2]]
            else:
                l, i = w[2], w[3]
                expected = agg_K_N2[l, np.searchsorted(sorted_K_N2[l], rewards_K_N2[l, i])]
                plain = plain_K_N2[l, i]
            assert adv_R[row] == expected, (pid, w)
            assert abs(adv_R[row] - plain) <= 1e-12
            if np.all((rewards_K_N2 == 0) | (rewards_K_N2 == 1)):
                assert (adv_R[row] == 0) == (plain == 0)

    # Reordering the rows again changes nothing, bit for bit (verl balances rows by length before this step).
    again, which_again = rows_of(prompts, np.random.default_rng(1), filler)
    position = {w: r for r, w in enumerate(which_again)}
    adv_again = flat_spiral_advantages(**again)
    assert all(adv_again[position[w]] == adv_R[r] for r, w in enumerate(which))


def test_flat_by_hand_paper_sizes_two_prompts_interleaved():
    """The by-hand example of test_advantages (N1=8, n=4, K=4, N2=4) twice, its rows reversed and interleaved."""
    sets_K_n = np.array([[0, 1, 2, 3], [0, 4, 5, 6], [1, 2, 4, 5], [2, 3, 5, 6]])
    rewards_K_N2 = np.array([[1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0]], dtype=float)
    columns, which = rows_of([("a", sets_K_n, rewards_K_N2, 8), ("b", sets_K_n, 1 - rewards_K_N2, 8)],
                             np.random.default_rng(0))
    adv = flat_spiral_advantages(**columns)
    search_a = [0, 1 / 4, 1 / 6, 1 / 4, -1 / 4, -1 / 6, -1 / 4, 0]
    for row, w in enumerate(which):
        if w[1] == "search":
            sign = 1 if w[0] == "a" else -1
            assert adv[row] == pytest.approx(sign * search_a[w[2]], abs=1e-15)
        else:
            r = rewards_K_N2[w[2], w[3]] if w[0] == "a" else 1 - rewards_K_N2[w[2], w[3]]
            assert adv[row] == [0, 0, r - 0.5, r - 0.5][w[2]]


def good_rows():
    """One prompt "p": N1=3 search rows, K=2 sets of n=2, N2=2 rows each; as a list of row dicts."""
    rows = [dict(prompt_ids="p", is_search=True, trace_index=j, set_index=-1, set_members=[-1, -1], rewards=np.nan)
            for j in range(3)]
    for l, members in enumerate([[0, 1], [1, 2]]):
        for r in (1.0, 0.0):
            rows.append(dict(prompt_ids="p", is_search=False, trace_index=-1, set_index=l, set_members=members,
                             rewards=r))
    return rows


def columns_of(rows):
    return {f: [row[f] for row in rows] for f in FIELDS}


def test_good_rows_are_accepted_and_lists_work():
    adv = flat_spiral_advantages(**columns_of(good_rows()))
    np.testing.assert_array_equal(adv, [0, 0, 0, 0.5, -0.5, 0.5, -0.5])  # equal set scores: no set-RL signal
    rows = good_rows()
    rows[3]["rewards"] = rows[4]["rewards"] = 1.0  # set 0 all right, set 1 half: f = (1, 0.5), A# = (.25, -.25)
    np.testing.assert_allclose(flat_spiral_advantages(**columns_of(rows))[:3], [0.25, 0, -0.25])
    assert flat_spiral_advantages(*[[] for _ in FIELDS[:4]], np.zeros((0, 2)), []).shape == (0,)


def _break(edit):
    rows = good_rows()
    edit(rows)
    return columns_of(rows)


def _set(i, **values):
    return lambda rows: rows[i].update(values)


@pytest.mark.parametrize("columns, message", [
    (_break(_set(4, set_members=[1, 2])),
     r"prompt p: the rows of set 0 disagree on its members: \[\[0, 1\], \[1, 2\]\]"),
    (_break(lambda rows: rows.pop(2)), r"prompt p: a set holds search trace 2, but the prompt has search rows only "
                                       r"for traces 0\.\.1 \(missing search rows\)"),
    (_break(_set(1, trace_index=2)), r"prompt p: the trace_index of its 3 search rows must be 0\.\.2 once each, got "
                                     r"\[0, 2, 2\]"),
    (_break(_set(1, trace_index=3)), r"got \[0, 2, 3\] \(missing search rows \[1\]\)"),
    (_break(_set(0, trace_index=np.nan)), r"prompt p: trace_index on search rows must be whole numbers >= 0"),
    (_break(_set(0, trace_index=0.5)), r"prompt p: trace_index on search rows must be whole numbers"),
    (_break(_set(3, rewards=np.nan)), r"prompt p: an aggregation row has reward nan"),
    (_break(_set(3, rewards=np.inf)), r"prompt p: an aggregation row has reward inf"),
    (_break(_set(3, set_index=1)), r"prompt p: sets 0\.\.1 must have equally many aggregation rows \(N2\), got "
                                   r"\{0: 1, 1: 3\}"),
    (_break(lambda rows: [r.update(set_index=2) for r in rows[5:]]), r"got \{0: 2, 1: 0, 2: 2\}"),
    (_break(_set(3, set_index=-1)), r"prompt p: set_index on aggregation rows must be whole numbers >= 0"),
    (_break(lambda rows: [r.update(set_members=[1, 1]) for r in rows[3:5]]), r"prompt p: a set repeats a trace"),
    (_break(lambda rows: [r.update(is_search=True, trace_index=3 + i) for i, r in enumerate(rows[3:])]),
     r"prompt p: has 7 search rows and 0 aggregation rows; it needs both"),
    (_break(lambda rows: rows.__delitem__(slice(0, 3))),
     r"prompt p: has 0 search rows and 4 aggregation rows"),
    (_break(_set(0, is_search=2)), r"is_search must be 7 booleans, got dtype int64"),
    (_break(_set(0, prompt_ids=["p"])), r"prompt_ids must be hashable, row 0 holds list"),
    (_break(_set(0, set_members=[-1])), r"set_members must hold numbers|set_members must have shape \(R, n\)"),
    (_break(_set(0, trace_index="first")), r"trace_index must hold numbers \(-1 or NaN where a field does not apply\)"),
    ({**columns_of(good_rows()), "rewards": [0.0] * 6}, r"rewards must have shape \(R,\) with R = 7 rows, got "
                                                        r"shape \(6,\)"),
])
def test_inconsistent_metadata_is_a_value_error_naming_the_prompt(columns, message):
    with pytest.raises(ValueError, match=message):
        flat_spiral_advantages(**columns)


def test_fields_that_do_not_apply_are_ignored():
    """Garbage in the fields a row does not use (rewards on search rows, trace_index on aggregation rows) is fine."""
    rows = good_rows()
    expected = flat_spiral_advantages(**columns_of(rows))
    for r in rows[:3]:
        r.update(rewards=np.inf, set_index=7.5, set_members=[np.nan, 99])
    for r in rows[3:]:
        r.update(trace_index=-3.5)
    np.testing.assert_array_equal(flat_spiral_advantages(**columns_of(rows)), expected)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=5), st.booleans(), st.integers(0, 2 ** 32 - 1))
def test_flat_group_advantages_equal_per_group_on_shuffled_rows(sizes, normalize_std, seed):
    rng = np.random.default_rng(seed)
    groups = [rng.normal(size=G) if rng.random() < 0.5 else rng.integers(0, 2, G).astype(float) for G in sizes]
    rows = [(p, i) for p, g in enumerate(groups) for i in range(len(g))]
    order = rng.permutation(len(rows))
    pids = [f"q{rows[k][0]}" for k in order]
    rewards = [groups[rows[k][0]][rows[k][1]] for k in order]
    adv = flat_group_advantages(pids, rewards, normalize_std)
    for row, k in enumerate(order):
        p, i = rows[k]
        sorted_G = np.sort(groups[p])
        exact = group_advantages(sorted_G, normalize_std)[np.searchsorted(sorted_G, groups[p][i])]
        assert adv[row] == exact
        assert abs(adv[row] - group_advantages(groups[p], normalize_std)[i]) <= 1e-12


def test_flat_group_advantages_errors():
    with pytest.raises(ValueError, match=r"prompt b: a row has reward nan"):
        flat_group_advantages(["a", "b", "b"], [1.0, np.nan, 0.0])
    with pytest.raises(ValueError, match=r"rewards must have shape \(R,\) with R = 2 rows"):
        flat_group_advantages(["a", "b"], [1.0])
