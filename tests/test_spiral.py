"""spiral.py: advantages reach the right samples, dynamic sampling, length-aware rule, metrics.

A scripted sampler replaces `rollout.generate` so every reward is known in advance: search trace j of a problem is
"good" or "bad" (its text says so), and an aggregation trace is correct iff its sample index is smaller than the
number of good candidates in its prompt. The expected advantages are then recomputed with plain loops.
"""

import re
import types

import numpy as np
import pytest

import spiral
from rollout import Completion
from problemset import Problem


def scripted_generate(good_traces):
    """A fake `rollout.generate`: good_traces maps problem text -> set of indices of good search traces."""
    calls = []

    def generate(model, tokenizer, prompts, *, samples_per_prompt, max_new_tokens, temperature=1.0,
                 micro_batch_size=None, tokens_per_micro_batch=None, progress=False):
        calls.append((list(prompts), samples_per_prompt))
        out = []
        for prompt in prompts:
            row = []
            if prompt.startswith("You are given a problem"):  # aggregation prompt
                num_good = len(re.findall(r"GOOD", prompt))
                for i in range(samples_per_prompt):
                    answer = "1" if i < num_good else "0"
                    row.append(_completion(f"aggregate \\boxed{{{answer}}}", length=3 + i, entropy=2.0 + i))
            else:  # search prompt: the problem text is the first line
                problem = prompt.split("\n")[0]
                for j in range(samples_per_prompt):
                    tag = "GOOD" if j in good_traces[problem] else "BAD"
                    row.append(_completion(f"trace {j} {tag} \\boxed{{{1 if tag == 'GOOD' else 0}}}", length=10 + j,
                                           entropy=0.1 * j + 0.01 * len(good_traces[problem])))
            out.append(row)
        return out

    return generate, calls


def _completion(text, length, entropy):
    return Completion(prompt_ids=[1, 2], completion_ids=list(range(length)), logprobs=[-0.5] * length, text=text,
                      truncated=False, entropies=[entropy] * length)


def fake_reward(text, gold):
    return float(text.endswith(f"\\boxed{{{gold}}}"))


@pytest.fixture
def world(monkeypatch):
    good = {"p0": {0, 1, 2}, "p1": {5}, "p2": set(), "p3": {0, 1, 2, 3, 4, 5, 6, 7}}
    generate, calls = scripted_generate(good)
    drawn_sets = []

    def recording_sample_sets(*args, **kwargs):
        sets = spiral_sample_sets(*args, **kwargs)
        drawn_sets.append(sets)
        return sets

    spiral_sample_sets = spiral.sample_sets
    monkeypatch.setattr(spiral, "generate", generate)
    monkeypatch.setattr(spiral, "reward", fake_reward)
    monkeypatch.setattr(spiral, "sample_sets", recording_sample_sets)
    return good, calls, drawn_sets


def problems_in_order(*names):
    queue = [Problem(problem=name, answer="1") for name in names]
    return lambda: queue.pop(0)


def test_spiral_advantages_reach_the_right_samples(world):
    good, calls, drawn_sets = world
    out = spiral.collect_spiral(None, None, problems_in_order("p0", "p1"), batch_problems=2, num_search=8,
                                set_size=4, num_sets=4, num_aggregations=4, max_new_tokens=64,
                                rng=np.random.default_rng(0))
    assert len(out.samples) == 2 * (8 + 16)
    # Two generate calls: all search prompts at once, then all K aggregation prompts per problem.
    assert [len(p) for p, _ in calls] == [2, 8] and [s for _, s in calls] == [8, 4]
    for i, name in enumerate(["p0", "p1"]):
        block = out.samples[i * 24:(i + 1) * 24]
        search, aggregation = block[:8], block[8:]
        assert [s.role for s in search] == ["search"] * 8 and [s.role for s in aggregation] == ["aggregation"] * 16
        sets_K_n = drawn_sets[i]
        # Slow, obvious recomputation of Algorithm 1 lines 7-14 from the scripted world.
        rewards_K_N2 = np.array([[float(j < len(set(s) & good[name])) for j in range(4)] for s in sets_K_n])
        set_scores = rewards_K_N2.mean(axis=1)
        set_adv = set_scores - set_scores.mean()
        for trace in range(8):
            containing = [set_adv[k] for k in range(4) if trace in sets_K_n[k]]
            expected = np.mean(containing) if containing else 0.0
            assert search[trace].advantage == pytest.approx(expected)
            assert search[trace].reward is None
        for k in range(4):
            for j in range(4):
                sample = aggregation[k * 4 + j]
                assert sample.reward == rewards_K_N2[k, j]
                assert sample.advantage == pytest.approx(rewards_K_N2[k, j] - rewards_K_N2[k].mean())
        # The set's traces appear in the aggregation prompt in the drawn order.
        prompt = calls[1][0][i * 4]
        positions = [prompt.index(f"trace {j} ") for j in sets_K_n[0]]
        assert positions == sorted(positions)


def test_dynamic_sampling_skips_problems_without_signal(world):
    good, calls, _ = world
    # p2 has no good trace and p3 only good ones: every aggregation reward is equal, so every advantage is 0.
    out = spiral.collect_spiral(None, None, problems_in_order("p2", "p3", "p0", "p1"), batch_problems=2,
                                max_new_tokens=64, rng=np.random.default_rng(1))
    m = out.metrics
    assert m["problems_drawn"] == 4 and m["problems_kept"] == 2 and m["problems_skipped"] == 2
    assert m["zero_advantage_fraction"] == 0.5
    assert len(out.samples) == 2 * 24
    assert len(calls) == 4  # a second round of search + aggregation for the two replacement problems


def test_generation_seconds_add_up_over_the_rounds_of_dynamic_sampling(world, monkeypatch):
    """time/search_s and time/aggregation_s are the sums over every generate call of the step, each timing only its
    own level: with a clock that advances one second per reading, two rounds give 2 s per level."""
    clock = iter(range(1000))
    monkeypatch.setattr(spiral, "time", types.SimpleNamespace(perf_counter=lambda: float(next(clock))))  # spiral's only
    out = spiral.collect_spiral(None, None, problems_in_order("p2", "p3", "p0", "p1"), batch_problems=2,
                                max_new_tokens=64, rng=np.random.default_rng(1))
    assert out.metrics["time/search_s"] == out.metrics["time/aggregation_s"] == 2.0


def test_max_draws_bounds_dynamic_sampling(world):
    out = spiral.collect_spiral(None, None, problems_in_order("p2", "p3", "p2"), batch_problems=2,
                                max_new_tokens=64, rng=np.random.default_rng(0), max_draws=3)
    assert out.metrics["problems_drawn"] == 3 and out.samples == []


def test_metrics_and_token_accounting(world):
    out = spiral.collect_spiral(None, None, problems_in_order("p0"), batch_problems=1, max_new_tokens=64,
                                rng=np.random.default_rng(0))
    m = out.metrics
    search_tokens = sum(10 + j for j in range(8))
    aggregation_tokens = 4 * sum(3 + i for i in range(4))
    assert m["tokens_generated"] == m["tokens_per_problem"] == search_tokens + aggregation_tokens
    assert m["search_accuracy"] == pytest.approx(3 / 8)
    assert m["search_length"] == pytest.approx(search_tokens / 8)
    assert m["token_budget_per_problem"] == (8 + 16) * 64
    assert 0 <= m["aggregation_accuracy"] <= 1


def test_length_aware_rule_zeroes_long_positive_advantages(world):
    kwargs = dict(batch_problems=1, max_new_tokens=64)
    plain = spiral.collect_spiral(None, None, problems_in_order("p0"), rng=np.random.default_rng(3), **kwargs)
    capped = spiral.collect_spiral(None, None, problems_in_order("p0"), rng=np.random.default_rng(3),
                                   target_length=12, **kwargs)
    assert len(plain.samples) == len(capped.samples)
    changed = 0
    for a, b in zip(plain.samples, capped.samples):
        length = len(a.completion_ids)
        if a.advantage > 0 and length > 12:
            assert b.advantage == 0
            changed += 1
        else:
            assert b.advantage == a.advantage
    assert changed > 0


def _adapter_marker(calls):
    """A stand-in aggregation_adapter context and the list of how many generate calls had run at its entry and exit."""
    entered = []

    class Marker:
        def __enter__(self):
            entered.append(len(calls))

        def __exit__(self, *exc):
            entered.append(len(calls))

    return Marker, entered


def test_aggregation_adapter_wraps_only_aggregation(world, monkeypatch):
    _, calls, _ = world
    Marker, entered = _adapter_marker(calls)

    spiral.collect_spiral(None, None, problems_in_order("p0"), batch_problems=1, max_new_tokens=64,
                          rng=np.random.default_rng(0), aggregation_adapter=Marker)
    assert entered == [1, 2]  # entered after the search call, left after the aggregation call


def test_grpo_group_advantages(world):
    out = spiral.collect_grpo(None, None, problems_in_order("p0", "p2", "p1"), batch_problems=2, group_size=8,
                              max_new_tokens=64)
    m = out.metrics
    assert m["problems_drawn"] == 3 and m["problems_kept"] == 2
    assert m["token_budget_per_problem"] == 8 * 64
    rewards = np.array([s.reward for s in out.samples[:8]])
    assert rewards.tolist() == [1, 1, 1, 0, 0, 0, 0, 0]
    assert [s.advantage for s in out.samples[:8]] == pytest.approx(rewards - rewards.mean())
    assert {s.role for s in out.samples} == {"grpo"}
    assert m["accuracy"] == pytest.approx((3 + 0 + 1) / 24)


@pytest.mark.parametrize("bad", [dict(batch_problems=0), dict(num_search=-1), dict(num_sets=2.5)])
def test_bad_counts_raise(world, bad):
    kwargs = dict(batch_problems=1, max_new_tokens=8, rng=np.random.default_rng(0)) | bad
    with pytest.raises(ValueError, match="must be a positive integer"):
        spiral.collect_spiral(None, None, problems_in_order("p0"), **kwargs)


def test_entropy_metrics_cover_every_trace_of_every_drawn_problem(world):
    """rollout/entropy_*: the token-level mean of the sampler's entropy over every trace of every drawn problem,
    skipped ones included (p2 gives no signal), so SPIRAL's search traces and GRPO's traces compare as in the
    paper's entropy figure. Scripted: search trace j of a problem with g good traces has entropy 0.1 j + 0.01 g at
    each of its 10 + j tokens, aggregation sample i has 2 + i at each of its 3 + i tokens."""
    base = sum(0.1 * j * (10 + j) for j in range(8)) / sum(10 + j for j in range(8))
    search = base + 0.01 * (0 + 3) / 2  # p2 (0 good traces, skipped) and p0 (3, kept) weigh the same
    aggregation = sum((2.0 + i) * (3 + i) for i in range(4)) / sum(3 + i for i in range(4))
    out = spiral.collect_spiral(None, None, problems_in_order("p2", "p0"), batch_problems=1, max_new_tokens=64,
                                rng=np.random.default_rng(0))
    assert out.metrics["problems_drawn"] == 2 and out.metrics["problems_kept"] == 1
    assert out.metrics["rollout/entropy_search"] == pytest.approx(search)
    assert out.metrics["rollout/entropy_aggregation"] == pytest.approx(aggregation)
    assert out.metrics["rollout/entropy_search"] != pytest.approx(base + 0.03)  # the kept problem's alone
    grpo = spiral.collect_grpo(None, None, problems_in_order("p2", "p0"), batch_problems=1, group_size=8,
                               max_new_tokens=64)
    assert grpo.metrics["problems_drawn"] == 2 and grpo.metrics["problems_kept"] == 1
    assert grpo.metrics["rollout/entropy_grpo"] == pytest.approx(search)  # same traces, same token weighting
    assert "rollout/entropy_search" not in grpo.metrics


def test_entropy_is_token_weighted_and_skips_unrecorded(world, monkeypatch):
    """Two problems whose traces differ in length: the mean is per token, not per trace; a Completion without
    recorded entropies (None) adds nothing rather than zeros."""
    traces = {"a": [_completion("x \\boxed{1}", 2, 1.0), _completion("x \\boxed{0}", 6, 3.0),
                    _completion("x \\boxed{0}", 1, 2.0)],
              "b": [_completion("y \\boxed{1}", 4, 5.0), _completion("y \\boxed{0}", 4, 0.0)]}
    traces["b"].append(Completion([1], [7, 7], [-1.0, -1.0], "z \\boxed{0}", False))  # entropies=None
    monkeypatch.setattr(spiral, "generate", lambda model, tok, prompts, samples_per_prompt, **kw:
                        [traces[p.split("\n")[0]][:samples_per_prompt] for p in prompts])
    out = spiral.collect_grpo(None, None, problems_in_order("a", "b"), batch_problems=2, group_size=3,
                              max_new_tokens=8)
    assert out.metrics["problems_drawn"] == 2
    assert out.metrics["rollout/entropy_grpo"] == pytest.approx((2 * 1 + 6 * 3 + 1 * 2 + 4 * 5 + 4 * 0) / 17)


# ----------------------------------------------------------------------------------------------------------------------
# The ablation arm, search_advantage="own": line 13 replaced by GRPO's advantage on each search trace's own reward


def _collect(names, search_advantage=None, seed=0, **kwargs):
    """collect_spiral over the scripted world (search_advantage left at its default when None)."""
    choice = {} if search_advantage is None else {"search_advantage": search_advantage}
    return spiral.collect_spiral(None, None, problems_in_order(*names), batch_problems=len(names), max_new_tokens=64,
                                 rng=np.random.default_rng(seed), **choice, **kwargs)


def test_own_search_rows_get_grpo_advantages_and_aggregation_rows_stay_spiral_s(world):
    """On the same rollouts (same seed, so the same sets): each search row's advantage is group_advantages of the
    N1 search rewards (r_j - mean r), its reward recorded; every aggregation row is exactly SPIRAL's."""
    good, _, drawn_sets = world
    own = _collect(["p0", "p1"], "own")
    spiral_run = _collect(["p0", "p1"], "set")
    assert np.array_equal(drawn_sets[0], drawn_sets[2]) and np.array_equal(drawn_sets[1], drawn_sets[3])  # same sets
    for i, name in enumerate(["p0", "p1"]):
        block, reference = own.samples[i * 24:(i + 1) * 24], spiral_run.samples[i * 24:(i + 1) * 24]
        rewards_N1 = np.array([float(j in good[name]) for j in range(8)])
        assert [s.advantage for s in block[:8]] == pytest.approx(rewards_N1 - rewards_N1.mean(), abs=1e-15)
        assert [s.reward for s in block[:8]] == rewards_N1.tolist() and {s.role for s in block[:8]} == {"search"}
        assert [(s.advantage, s.reward, s.role) for s in block[8:]] == \
            [(s.advantage, s.reward, s.role) for s in reference[8:]]  # bit for bit
        assert [s.advantage for s in block[:8]] != [s.advantage for s in reference[:8]]  # line 13 differs
    # p1 has one good trace of 8: A = 1 - 1/8 for it, -1/8 for the seven others.
    assert sorted(s.advantage for s in own.samples[24:32]) == [-0.125] * 7 + [0.875]


def test_set_is_the_default_and_exactly_the_marginal_set_advantage(world):
    """The default is SPIRAL, bit for bit: search rows are spiral_advantages(sets, rewards)[0] (==, not approx),
    and carry no reward."""
    from advantages import spiral_advantages

    good, _, drawn_sets = world
    default, explicit = _collect(["p0", "p1"]), _collect(["p0", "p1"], "set")
    assert [(s.advantage, s.reward) for s in default.samples] == [(s.advantage, s.reward) for s in explicit.samples]
    for i, name in enumerate(["p0", "p1"]):
        rewards_K_N2 = np.array([[float(j < len(set(s) & good[name])) for j in range(4)] for s in drawn_sets[i]])
        adv_N1, adv_K_N2 = spiral_advantages(drawn_sets[i], rewards_K_N2=rewards_K_N2, N1=8)
        block = default.samples[i * 24:(i + 1) * 24]
        assert [s.advantage for s in block[:8]] == adv_N1.tolist() and {s.reward for s in block[:8]} == {None}
        assert [s.advantage for s in block[8:]] == adv_K_N2.ravel().tolist()


def test_own_keeps_a_problem_whose_search_rewards_alone_differ(monkeypatch):
    """Dynamic sampling keeps a problem when any advantage is non-zero: an aggregator that is always wrong gives set
    RL nothing (skipped), while "own" still has the search traces' own rewards (kept)."""
    def generate(model, tokenizer, prompts, *, samples_per_prompt, **kwargs):
        if prompts[0].startswith("You are given a problem"):  # aggregation: always wrong
            return [[_completion("\\boxed{0}", 3, 1.0)] * samples_per_prompt for _ in prompts]
        return [[_completion(f"\\boxed{{{int(j < 2)}}}", 5, 1.0) for j in range(samples_per_prompt)] for _ in prompts]

    monkeypatch.setattr(spiral, "generate", generate)
    monkeypatch.setattr(spiral, "reward", fake_reward)
    for choice, kept in (("set", 0), ("own", 1)):
        out = _collect(["q"], choice, max_draws=1)
        assert out.metrics["problems_kept"] == kept and len(out.samples) == 24 * kept


def test_own_with_the_length_rule_and_the_aggregator_adapter(world):
    """The length-aware rule applies to the own-reward advantages too (a right search trace longer than L_target
    gets 0), and the two-model variant still wraps the aggregation call only."""
    good, calls, _ = world
    plain, capped = _collect(["p0"], "own"), _collect(["p0"], "own", target_length=11)
    for a, b in zip(plain.samples[:8], capped.samples[:8]):  # search trace j has 10 + j tokens
        assert b.advantage == (0.0 if a.advantage > 0 and len(a.completion_ids) > 11 else a.advantage)
    assert sum(a.advantage != b.advantage for a, b in zip(plain.samples[:8], capped.samples[:8])) == 1  # trace 2
    Marker, entered = _adapter_marker(calls)

    before = len(calls)
    _collect(["p0"], "own", aggregation_adapter=Marker)
    assert entered == [before + 1, before + 2]


def test_search_advantage_is_checked(world):
    with pytest.raises(ValueError, match="'set', 'own' or 'none'"):
        _collect(["p0"], "mine")
    with pytest.raises(ValueError, match="concerns set RL only"):
        _collect(["p0"], "own", search_advantage_scale=0.5)
    assert _collect(["p0"], "set", search_advantage_scale=0.5).samples  # set RL takes the scale


def test_tokens_generated_are_split_by_level(world):
    """tokens_per_problem_{search,aggregation}: completion tokens generated per drawn problem on each level (a
    skipped problem's count too), summing to tokens_per_problem."""
    out = spiral.collect_spiral(None, None, problems_in_order("p2", "p0"), batch_problems=1, max_new_tokens=64,
                                rng=np.random.default_rng(0))
    m = out.metrics
    search, aggregation = sum(10 + j for j in range(8)), 4 * sum(3 + i for i in range(4))  # per drawn problem
    assert m["problems_drawn"] == 2 and m["tokens_generated"] == 2 * (search + aggregation)
    assert m["tokens_per_problem_search"] == search and m["tokens_per_problem_aggregation"] == aggregation
    assert m["tokens_per_problem"] == search + aggregation  # per DRAWN problem: the skipped p2 counts


# ----------------------------------------------------------------------------------------------------------------------
# The floor (search_advantage="none"), the perfect selector (aggregator="oracle"), every set (num_sets="all"), and
# the instruments that say whether line 13 can act


def test_none_zeroes_the_search_rows_and_leaves_aggregation_spiral_s(world):
    """search_advantage="none": every search row has advantage exactly 0 (no gradient), the aggregation rows are
    SPIRAL's bit for bit on the same sets, and a problem is kept for its aggregation signal."""
    none, reference = _collect(["p0", "p1"], "none"), _collect(["p0", "p1"], "set")
    for i in range(2):
        block, ref = none.samples[i * 24:(i + 1) * 24], reference.samples[i * 24:(i + 1) * 24]
        assert [s.advantage for s in block[:8]] == [0.0] * 8 and {s.reward for s in block[:8]} == {None}
        assert [(s.advantage, s.reward) for s in block[8:]] == [(s.advantage, s.reward) for s in ref[8:]]
        assert any(s.advantage != 0 for s in ref[:8])  # SPIRAL's search rows had a signal here
    assert none.metrics["problems_kept"] == 2


def test_oracle_scores_each_set_by_its_best_trace_and_samples_no_aggregation(world):
    """aggregator="oracle": one generate call (search only), f_hat(x, G) = max_{y in G} r(x, y), line 13 as SPIRAL's
    on those scores, recomputed here with plain loops; only search Samples, each with its reward."""
    good, calls, drawn_sets = world
    out = _collect(["p0", "p1"], aggregator="oracle")
    assert len(calls) == 1 and calls[0][1] == 8  # no aggregation prompt was sampled
    assert len(out.samples) == 16 and {s.role for s in out.samples} == {"search"}
    for i, name in enumerate(["p0", "p1"]):
        rewards_N1 = [float(j in good[name]) for j in range(8)]
        scores = [max(rewards_N1[j] for j in G) for G in drawn_sets[i]]
        set_adv = [s - np.mean(scores) for s in scores]
        for j, sample in enumerate(out.samples[i * 8:(i + 1) * 8]):
            containing = [a for a, G in zip(set_adv, drawn_sets[i]) if j in G]
            assert sample.advantage == pytest.approx(np.mean(containing) if containing else 0.0, abs=1e-15)
            assert sample.reward == rewards_N1[j]
    m = out.metrics
    assert "aggregation_accuracy" not in m and m["tokens_per_problem_aggregation"] == 0
    assert m["token_budget_per_problem"] == 8 * 64 and m["time/aggregation_s"] == 0.0


def test_oracle_over_all_sets_is_the_pass_at_n_closed_form(world):
    """num_sets="all" with the oracle: every one of the C(8, 4) = 70 sets, and the search advantages are PKPO's
    pass@n advantages (advantages.pass_at_n_advantages) on the traces' rewards; no set is sampled."""
    from advantages import pass_at_n_advantages

    good, _, drawn_sets = world
    out = _collect(["p0", "p1"], aggregator="oracle", num_sets="all")
    assert drawn_sets == []  # sample_sets was not called
    for i, name in enumerate(["p0", "p1"]):
        rewards_N1 = np.array([float(j in good[name]) for j in range(8)])
        assert [s.advantage for s in out.samples[i * 8:(i + 1) * 8]] == \
            pytest.approx(pass_at_n_advantages(rewards_N1, 4).tolist(), abs=1e-12)
    assert out.metrics["gradient_scale_M"] == pytest.approx(1.0)  # M at K = C(8, 4): N1/n - 1


def test_all_sets_with_the_model_aggregator_prompts_every_set(world):
    _, calls, drawn_sets = world
    out = _collect(["p1"], num_sets="all")
    assert drawn_sets == [] and [len(p) for p, _ in calls] == [1, 70]
    assert len(out.samples) == 8 + 70 * 4 and out.metrics["token_budget_per_problem"] == (8 + 280) * 64


def test_oracle_refuses_a_search_advantage_other_than_set(world):
    for choice in ("own", "none"):
        with pytest.raises(ValueError, match="must be 'set'"):
            _collect(["p0"], choice, aggregator="oracle")
    with pytest.raises(ValueError, match="'model' or 'oracle'"):
        _collect(["p0"], aggregator="perfect")


def test_line13_instruments_recomputed_by_hand(world):
    """line13/* over the drawn problems, recomputed from the sets and rewards: the fraction of problems whose K set
    scores differ, the mean sd of the scores, the correlation of A#_marg with r - mean r over all search traces,
    and the share of wrong traces with A#_marg > 0. p3 (all good) is drawn and skipped but still counts."""
    from advantages import spiral_advantages

    good, _, drawn_sets = world
    out = _collect(["p3", "p1", "p0"], "own", max_draws=3)  # the instruments read line 13 whatever trains the search traces
    scores, set_adv, own_adv, rewards = [], [], [], []
    for i, name in enumerate(["p3", "p1", "p0"]):
        r_N1 = np.array([float(j in good[name]) for j in range(8)])
        r_K_N2 = np.array([[float(j < len(set(s) & good[name])) for j in range(4)] for s in drawn_sets[i]])
        scores.append(r_K_N2.mean(1))
        set_adv.append(spiral_advantages(drawn_sets[i], rewards_K_N2=r_K_N2, N1=8)[0])
        own_adv.append(r_N1 - r_N1.mean())
        rewards.append(r_N1)
    m = out.metrics
    assert m["line13/set_scores_differ"] == pytest.approx(np.mean([len(set(s)) > 1 for s in scores]))
    assert m["line13/set_score_sd"] == pytest.approx(np.mean([np.std(s) for s in scores]))
    a, o, r = np.concatenate(set_adv), np.concatenate(own_adv), np.concatenate(rewards)
    assert m["line13/corr_set_own"] == pytest.approx(np.corrcoef(a, o)[0, 1])
    assert m["line13/wrong_positive"] == pytest.approx(np.mean(a[r == 0] > 0))
    assert 0 < m["line13/set_scores_differ"] < 1  # p3's sets all score 1: not every problem differs


def test_instruments_omit_what_is_undefined(monkeypatch):
    """All search traces right (no wrong trace) and constant set scores: no correlation and no wrong-trace share
    are logged (never NaN), and the fraction of problems whose set scores differ is 0."""
    monkeypatch.setattr(spiral, "generate", lambda model, tok, prompts, samples_per_prompt, **kw:
                        [[_completion("\\boxed{1}", 3, 1.0)] * samples_per_prompt for _ in prompts])
    monkeypatch.setattr(spiral, "reward", fake_reward)
    m = _collect(["q"], max_draws=1).metrics
    assert m["line13/set_scores_differ"] == 0.0 and m["line13/set_score_sd"] == 0.0
    assert "line13/corr_set_own" not in m and "line13/wrong_positive" not in m


def test_draw_cap_hit_says_when_max_draws_ended_the_step(world):
    short = spiral.collect_spiral(None, None, problems_in_order("p2", "p3", "p0"), batch_problems=2,
                                  max_new_tokens=64, rng=np.random.default_rng(0), max_draws=3)
    refilled = spiral.collect_spiral(None, None, problems_in_order("p2", "p0", "p1"), batch_problems=2,
                                     max_new_tokens=64, rng=np.random.default_rng(0), max_draws=3)
    assert short.metrics["draw_cap_hit"] == 1 and short.metrics["problems_kept"] == 1
    assert refilled.metrics["problems_drawn"] == 3 and refilled.metrics["draw_cap_hit"] == 0  # |B| kept at the cap
    grpo = spiral.collect_grpo(None, None, problems_in_order("p2", "p3"), batch_problems=1, group_size=8,
                               max_new_tokens=64, max_draws=2)
    assert grpo.metrics["draw_cap_hit"] == 1 and grpo.metrics["problems_kept"] == 0
