"""advantages.py: every function against a slow, obviously correct loop, plus inputs and imports."""

import ast
import math
import pathlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from advantages import (aggregation_advantages, group_advantages, length_aware, marginal_set_advantages,
                        marginal_set_advantages_by_definition, set_advantages, spiral_advantages)
from setsample import sample_sets

ROOT = pathlib.Path(__file__).resolve().parents[1]


def frozen(array):
    """A read-only copy: any write into an input raises instead of passing silently."""
    array = np.array(array, dtype=float)
    array.flags.writeable = False
    return array


def random_rewards(rng, shape, kind):
    """Binary rewards (equal-valued groups are common), Gaussian ones, or 0.1s whose mean is inexact."""
    if kind == "binary":
        return rng.integers(0, 2, size=shape).astype(float)
    if kind == "gaussian":
        return rng.normal(size=shape)
    return np.where(rng.random(shape) < 0.8, 0.1, 0.3)


# Slow loops, written straight from the paper's equations.

def slow_centre(values):
    mean = sum(values) / len(values)
    return [0.0 if all(v == values[0] for v in values) else v - mean for v in values]


def slow_marginal(sets, set_adv, num_traces):
    """advantages.py keeps the definition as a loop too (marginal_set_advantages_by_definition); this copy is the
    test's own, so a bug in that reference cannot hide one in the vectorised form."""
    out = []
    for j in range(num_traces):
        containing = [set_adv[l] for l, G in enumerate(sets) if j in G]  # A#(G) for G in G(y_j)
        out.append(sum(containing) / len(containing) if containing else 0.0)
    return out


def slow_group(rewards_G, normalize_std):
    centred = slow_centre(list(rewards_G))
    if not normalize_std:
        return centred
    std = math.sqrt(sum(c * c for c in centred) / len(centred))  # population std
    return [c / std if std > 0 else 0.0 for c in centred]


@st.composite
def spiral_problems(draw):
    N1 = draw(st.integers(1, 10))
    n = draw(st.integers(1, N1))
    K = draw(st.integers(1, min(math.comb(N1, n), 8)))
    N2 = draw(st.integers(1, 5))
    kind = draw(st.sampled_from(["binary", "gaussian", "tenths"]))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    sets_K_n = sample_sets(N1, n, K, ordered=draw(st.booleans()), rng=rng)
    sets_K_n.flags.writeable = False
    return sets_K_n, frozen(random_rewards(rng, (K, N2), kind)), N1


@settings(max_examples=200, deadline=None, derandomize=True)
@given(spiral_problems())
def test_against_slow_loops(problem):
    sets_K_n, rewards_K_N2, N1 = problem
    scores_K = frozen(rewards_K_N2.mean(axis=1))

    adv_K = set_advantages(scores_K)
    assert np.allclose(adv_K, slow_centre(list(scores_K)), rtol=0, atol=1e-12)

    adv_N1 = marginal_set_advantages(sets_K_n, frozen(adv_K), N1)
    assert adv_N1.shape == (N1,)
    in_every_set = [all(j in G for G in sets_K_n.tolist()) for j in range(N1)]
    assert np.all(adv_N1[in_every_set] == 0.0)
    assert np.allclose(adv_N1, slow_marginal(sets_K_n.tolist(), list(adv_K), N1), rtol=0, atol=1e-12)
    reference_N1 = marginal_set_advantages_by_definition(sets_K_n, adv_K, N1)  # the module's own loop
    assert np.array_equal(reference_N1, slow_marginal(sets_K_n.tolist(), list(adv_K), N1))
    assert np.allclose(adv_N1, reference_N1, rtol=0, atol=1e-12)

    adv_K_N2 = aggregation_advantages(rewards_K_N2)
    assert np.array_equal(adv_K_N2 == 0, np.array([slow_centre(list(r)) for r in rewards_K_N2]) == 0)
    assert np.allclose(adv_K_N2, [slow_centre(list(r)) for r in rewards_K_N2], rtol=0, atol=1e-12)

    search, aggregation = spiral_advantages(sets_K_n, rewards_K_N2=rewards_K_N2, N1=N1)
    assert np.allclose(search, adv_N1, rtol=0, atol=1e-12)
    assert np.array_equal(aggregation, adv_K_N2)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.integers(1, 4), st.integers(1, 6), st.booleans(), st.sampled_from(["binary", "gaussian", "tenths"]),
       st.integers(0, 2 ** 32 - 1))
def test_group_advantages_against_slow_loop(B, G, normalize_std, kind, seed):
    rewards_B_G = frozen(random_rewards(np.random.default_rng(seed), (B, G), kind))
    with np.errstate(all="raise"):  # a division by a zero std would raise here
        adv_B_G = group_advantages(rewards_B_G, normalize_std=normalize_std)
        adv_G = group_advantages(rewards_B_G[0], normalize_std=normalize_std)
    expected = np.array([slow_group(r, normalize_std) for r in rewards_B_G])
    assert adv_B_G.shape == (B, G) and not np.any(np.isnan(adv_B_G))
    assert np.allclose(adv_B_G, expected, rtol=1e-9, atol=1e-9)
    assert np.array_equal(adv_B_G == 0, expected == 0)
    assert np.allclose(adv_G, expected[0], rtol=1e-9, atol=1e-9)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.floats(-2, 2), st.integers(0, 20)), min_size=1, max_size=12), st.integers(0, 20))
def test_length_aware_against_slow_loop(pairs, target):
    advantages = frozen([a for a, _ in pairs])
    lengths = np.array([L for _, L in pairs])
    lengths.flags.writeable = False
    expected = [0.0 if a > 0 and L > target else a for a, L in pairs]
    out = length_aware(advantages, lengths, target)
    assert out.dtype == np.float64 and out.tolist() == expected


def test_length_aware_cases_and_shapes():
    adv = np.array([[0.5, 0.5, 0.5], [-0.5, -0.5, 0.0]])
    lengths = np.array([[9, 10, 11], [9, 11, 11]])
    out = length_aware(adv, lengths, 10)
    # long positive -> 0; L == target keeps; negatives and zeros unchanged
    np.testing.assert_array_equal(out, [[0.5, 0.5, 0.0], [-0.5, -0.5, 0.0]])
    np.testing.assert_array_equal(adv, [[0.5, 0.5, 0.5], [-0.5, -0.5, 0.0]])  # input untouched
    assert length_aware([1.0, -1.0], [5000, 5000], 4096.0).tolist() == [0.0, -1.0]


def test_spiral_advantages_paper_sizes_by_hand():
    """N1=8, n=4, K=4, N2=4. Set scores [1, 0, .5, .5], so A# = [.5, -.5, 0, 0]; trace 7 is in no set."""
    sets_K_n = [[0, 1, 2, 3], [0, 4, 5, 6], [1, 2, 4, 5], [2, 3, 5, 6]]
    rewards_K_N2 = [[1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0]]
    search, aggregation = spiral_advantages(sets_K_n, rewards_K_N2=rewards_K_N2, N1=8)
    np.testing.assert_allclose(search, [0, 1 / 4, 1 / 6, 1 / 4, -1 / 4, -1 / 6, -1 / 4, 0], atol=1e-15)
    np.testing.assert_array_equal(aggregation, [[0, 0, 0, 0], [0, 0, 0, 0],
                                                [0.5, 0.5, -0.5, -0.5], [0.5, -0.5, 0.5, -0.5]])


def test_equal_values_give_exact_zeros():
    """mean([0.1, 0.1, 0.1]) is 0.10000000000000002; the advantage must still be exactly 0, since
    filtering "all-zero-advantage" prompts (the paper's dynamic sampling) compares with 0."""
    tenths = [0.1, 0.1, 0.1]
    assert np.mean(tenths) != 0.1  # the trap is real
    assert set_advantages(tenths).tolist() == [0.0, 0.0, 0.0]
    assert aggregation_advantages([tenths, [0.0, 1.0, 0.5]])[0].tolist() == [0.0, 0.0, 0.0]
    assert group_advantages(tenths).tolist() == [0.0, 0.0, 0.0]
    assert group_advantages([tenths], normalize_std=True).tolist() == [[0.0, 0.0, 0.0]]


def test_group_advantages_std_is_population_std():
    assert group_advantages([0.0, 1.0], normalize_std=True).tolist() == [-1.0, 1.0]
    assert group_advantages([0.0, 1.0]).tolist() == [-0.5, 0.5]


def test_a_trace_in_every_set_gets_exactly_zero():
    """A trace in all K sets averages every centred set advantage: 0 in exact arithmetic. The float mean of
    A# = f - mean(f) for f = (0.25, 0.5, 1.0) is -3.7e-17, which `advantage != 0` would treat as signal."""
    sets_K_n = [[0, 1, 2], [0, 1, 3], [0, 2, 3]]  # trace 0 is in all three sets
    adv_K = set_advantages([0.25, 0.5, 1.0])
    assert sum(adv_K) / 3 != 0  # the trap is real
    adv_N1 = marginal_set_advantages(sets_K_n, adv_K, 5)
    assert adv_N1[0] == 0.0 and adv_N1[4] == 0.0  # in every set; in none
    assert adv_N1[1] == pytest.approx((adv_K[0] + adv_K[1]) / 2)
    search_N1, _ = spiral_advantages(sets_K_n, rewards_K_N2=[[0, 0, 1, 0], [1, 0, 1, 0], [1, 1, 1, 1]], N1=5)
    assert search_N1[0] == 0.0


def test_marginal_uncovered_trace_gets_zero_and_lists_work():
    assert marginal_set_advantages([[0, 1], [1, 2]], [1.0, -1.0], 4).tolist() == [1.0, 0.0, -1.0, 0.0]
    assert marginal_set_advantages(np.array([[2, 0]], dtype=np.uint8), [0.0], 3).tolist() == [0.0] * 3


@pytest.mark.parametrize("call, message", [
    (lambda: marginal_set_advantages([[0, 1], [1, 2]], [1.0], 3),
     r"shape \(K, n\) with K = len\(set_advantages\) = 1"),
    (lambda: marginal_set_advantages([0, 1], [1.0], 3), r"got shape \(2,\)"),
    (lambda: marginal_set_advantages([[0.0, 1.0]], [1.0], 3), r"integer trace indices, got dtype float64"),
    (lambda: marginal_set_advantages([[0, 3]], [1.0], 3), r"indices in \[0, 3\), got values from 0 to 3"),
    (lambda: marginal_set_advantages([[-1, 2]], [1.0], 3), r"got values from -1 to 2"),
    (lambda: marginal_set_advantages([[1, 1]], [1.0], 3), r"repeats a trace index"),
    (lambda: marginal_set_advantages([[0, 1]], [1.0], 0), r"num_traces must be a positive integer, got 0"),
    (lambda: marginal_set_advantages([[0, 1]], [np.nan], 3), r"set_advantages must be finite"),
    (lambda: set_advantages([[1.0, 2.0]]), r"set_scores must have 1 dimension\(s\), got shape \(1, 2\)"),
    (lambda: set_advantages([]), r"set_scores needs at least one value per group, got shape \(0,\)"),
    (lambda: aggregation_advantages([1.0, 0.0]), r"rewards must have 2 dimension\(s\), got shape \(2,\)"),
    (lambda: spiral_advantages([[0, 1]], rewards_K_N2=[[1.0], [0.0]], N1=3),
     r"one row per set.*\(1, 2\).*\(2, 1\) \(an \(N2, K\) array transposed\?\)"),
    (lambda: spiral_advantages([[0, 1]], rewards_K_N2=[[np.inf]], N1=3), r"rewards_K_N2 must be finite"),
    (lambda: group_advantages(1.0), r"at least one value per group, got shape \(\)"),
    (lambda: length_aware([1.0, 2.0], [1, 2, 3], 2),
     r"lengths must have the shape of advantages \(2,\), got \(3,\)"),
    (lambda: length_aware([1.0], [1], None), r"target_length must be a number, got None"),
])
def test_bad_inputs(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_rewards_and_N1_must_be_named_so_the_call_says_which_axis_is_K():
    """At K = N2 a transposed (N2, K) array has the right shape; naming the argument is the only guard, so a
    positional call is refused. A transposed array at K != N2 is refused by its shape."""
    sets_K_n = [[0, 1], [1, 2], [0, 2], [2, 3]]  # K = 4 sets, N2 = 4 rewards each
    rewards_K_N2 = np.array([[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 0, 0]], dtype=float)
    with pytest.raises(TypeError):
        spiral_advantages(sets_K_n, rewards_K_N2, 4)
    adv_N1, adv_K_N2 = spiral_advantages(sets_K_n, rewards_K_N2=rewards_K_N2, N1=4)
    transposed_N1, _ = spiral_advantages(sets_K_n, rewards_K_N2=rewards_K_N2.T, N1=4)
    assert not np.allclose(adv_N1, transposed_N1)  # the mistake the names guard against changes the result
    with pytest.raises(ValueError, match=r"\(an \(N2, K\) array transposed\?\)"):
        spiral_advantages(sets_K_n[:3], rewards_K_N2=rewards_K_N2[:3].T, N1=4)  # K = 3, N2 = 4


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, bool])
def test_outputs_are_float64_whatever_the_inputs_dtype(dtype):
    """The documented contract (PORTING.md casts at the loss): float64 out, for any input dtype, with values
    equal to those of float64 inputs."""
    sets_K_n = np.array([[0, 1], [1, 2]], dtype=np.int32)
    rewards_K_N2 = np.array([[1, 0, 1], [0, 0, 1]], dtype=dtype)
    exact_N1, exact_K_N2 = spiral_advantages(sets_K_n, rewards_K_N2=rewards_K_N2.astype(float), N1=3)
    outputs = [*spiral_advantages(sets_K_n, rewards_K_N2=rewards_K_N2, N1=3), aggregation_advantages(rewards_K_N2),
               set_advantages(rewards_K_N2[:, 0]), group_advantages(rewards_K_N2, normalize_std=True),
               marginal_set_advantages(sets_K_n, rewards_K_N2[:, 0], 3), length_aware(rewards_K_N2, [[1] * 3] * 2, 0)]
    assert [out.dtype for out in outputs] == [np.float64] * len(outputs)
    assert np.array_equal(outputs[0], exact_N1) and np.array_equal(outputs[1], exact_K_N2)


@pytest.mark.parametrize("filename", ["setsample.py", "advantages.py"])
def test_imports_only_numpy_and_the_standard_library(filename):
    tree = ast.parse((ROOT / filename).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported and imported <= {"numpy", "math", "fractions", "itertools", "typing", "__future__"}
