"""The grader under interruption, fork, stalls and start-up failures: it is never wrong afterwards,
never raises inside training, and counts every comparison it could not grade."""

import json
import os
import signal
import threading
import time
import warnings

import numpy as np
import pytest

import reward
import spiral
from rollout import Completion
from problemset import Problem

SLOW_ANSWER = "\\boxed{(10^{7})!}"  # about a second in the worker before math-verify's own limit stops it


def delta(before):
    return {key: count - before[key] for key, count in reward.grader_stats().items()}


@pytest.fixture
def fresh_cache():
    """Verdicts cached by other tests would let a pair skip the worker."""
    reward._verify_cached.cache_clear()
    yield
    reward._verify_cached.cache_clear()


def assert_grades_correctly():
    """Alternating verdicts: a reply left over from an earlier request would shift every one of them."""
    assert reward.reward("\\boxed{\\frac12}", "0.5") == 1.0
    assert reward.reward("\\boxed{3}", "4") == 0.0
    assert reward.reward("\\boxed{\\frac{2}{3}}", "0.666666666667") == 1.0
    assert reward.reward("\\boxed{x^2}", "2x") == 0.0
    assert reward.reward("\\boxed{(1,3)}", "(1, 3)") == 1.0


class CallerTimeout(Exception):
    """What a caller's own signal-based timeout raises (e.g. a test harness or a job scheduler)."""


@pytest.mark.parametrize("interruption", [KeyboardInterrupt, CallerTimeout])
def test_an_interrupted_call_never_leaks_its_verdict(fresh_cache, interruption):
    reward.reward("\\boxed{1}", "1.5")  # a worker is running
    before, cached = reward.grader_stats(), reward._verify_cached.cache_info().currsize

    def interrupt(signum, frame):
        raise interruption

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.3)  # while the worker is busy with SLOW_ANSWER
    try:
        with pytest.raises(interruption):
            reward.reward(SLOW_ANSWER, "2")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert reward._GRADER._process is None  # killed before re-raising
    assert delta(before)["worker_restarts"] == 1
    assert_grades_correctly()
    assert reward._verify_cached.cache_info().currsize == cached + 5  # the interrupted pair was not cached


def test_stale_replies_are_discarded(fresh_cache):
    """A reply to a request nobody waits for any more (here an orphan request, id -5) never answers another."""
    reward.reward("\\boxed{1}", "1.5")
    reward._GRADER._process.stdin.write(json.dumps([-5, "3", "3"]).encode() + b"\n")  # its reply "-5 1" comes first
    assert reward._GRADER.equivalent("3", "4") is False
    reward._GRADER._process.stdin.write(json.dumps([-6, "3", "4"]).encode() + b"\n")
    assert reward._GRADER.equivalent("3", "3.0") is True


def test_a_hard_timeout_is_counted_and_not_cached(fresh_cache, monkeypatch):
    pair = ("\\frac{5}{7}", "\\frac{10}{14}")
    before = reward.grader_stats()
    monkeypatch.setattr(reward, "GRADE_TIMEOUT_S", 0.0)  # no reply can arrive in time
    assert not reward.answers_equivalent(*pair)
    assert delta(before) == {"ungraded": 1, "timeouts": 1, "worker_restarts": 1, "start_failures": 0}
    monkeypatch.setattr(reward, "GRADE_TIMEOUT_S", 5.0)
    assert reward.answers_equivalent(*pair)  # graded now: the timeout was not a verdict


def test_math_verify_timeouts_are_counted_and_not_cached(fresh_cache):
    before = reward.grader_stats()
    assert reward.reward("\\boxed{9^{9^{9^{9}}}}", "7") == 0.0  # math-verify's own 1 s limit
    assert delta(before) == {"ungraded": 1, "timeouts": 1, "worker_restarts": 0, "start_failures": 0}
    assert reward._verify_cached.cache_info().currsize == 0


BROKEN_WORKERS = {  # worker source, start-up time limit, what the warning must name
    "no math-verify": ("import sys; sys.modules['math_verify'] = None\n" + reward._WORKER_SOURCE, 60, "math_verify"),
    "dies": ("import sys; sys.exit(3)", 60, "status 3"),
    "stalls": ("import time; time.sleep(60)", 0.2, "not ready within"),
}


@pytest.mark.parametrize("broken", sorted(BROKEN_WORKERS))
def test_start_failures_score_zero_warn_once_and_recover(fresh_cache, monkeypatch, broken):
    source, start_timeout_s, cause = BROKEN_WORKERS[broken]
    grader = reward._GradingWorker()
    monkeypatch.setattr(reward, "_GRADER", grader)
    monkeypatch.setattr(reward, "_WORKER_SOURCE", source)
    monkeypatch.setattr(reward, "START_BACKOFF_S", 0.01)
    monkeypatch.setattr(reward, "WORKER_START_TIMEOUT_S", start_timeout_s)
    try:
        with pytest.warns(RuntimeWarning, match=cause):
            assert reward.reward("\\boxed{\\frac{3}{6}}", "0.5") == 0.0  # no exception inside training
        assert reward.grader_stats() == {"ungraded": 1, "timeouts": 0, "worker_restarts": 0,
                                         "start_failures": reward.START_ATTEMPTS}
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once: no second warning
            start = time.perf_counter()
            assert reward.reward("\\boxed{\\frac{3}{6}}", "0.5") == 0.0
            assert time.perf_counter() - start < 0.2  # within START_RETRY_AFTER_S: no new attempt
        assert reward.grader_stats()["ungraded"] == 2
        assert reward.grader_stats()["start_failures"] == reward.START_ATTEMPTS
        assert cause in reward.check_grader()

        monkeypatch.setattr(reward, "_WORKER_SOURCE", BROKEN_WORKERS["no math-verify"][0].split("\n", 1)[1])
        monkeypatch.setattr(reward, "WORKER_START_TIMEOUT_S", 120.0)
        grader._retry_after = 0.0  # the retry pause is over
        assert reward.reward("\\boxed{\\frac{3}{6}}", "0.5") == 1.0  # the zeros were not cached
        assert reward.check_grader() is None
    finally:
        grader.close()


def test_a_worker_found_dead_is_replaced(fresh_cache):
    reward.reward("\\boxed{1}", "1.5")
    before = reward.grader_stats()
    reward._GRADER._process.kill()
    reward._GRADER._process.wait()
    assert_grades_correctly()
    assert delta(before)["worker_restarts"] == 1


def test_fork_while_another_thread_grades(fresh_cache):
    """The child gets a fresh lock and its own worker; it must not wait for a lock held by a thread it lacks."""
    reward.reward("\\boxed{1}", "1.5")
    busy = threading.Thread(target=reward.reward, args=(SLOW_ANSWER, "3"))
    busy.start()
    deadline = time.monotonic() + 10
    while not reward._GRADER._lock.locked():
        assert time.monotonic() < deadline
        time.sleep(0.001)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12+: fork() with threads
        pid = os.fork()
    if pid == 0:  # the child: grade, then leave without running pytest's teardown
        try:
            ok = reward.reward("\\boxed{\\frac{3}{6}}", "0.5") == 1.0 and reward.reward("\\boxed{3}", "4") == 0.0
            os._exit(0 if ok else 1)
        except BaseException:
            os._exit(2)
    try:
        deadline = time.monotonic() + 60
        while (status := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        if status[0] == 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung in reward()")
        assert os.waitstatus_to_exitcode(status[1]) == 0
    finally:
        busy.join(timeout=30)
    assert_grades_correctly()  # the parent's worker was left alone


def _one_completion_per_prompt(model, tokenizer, prompts, *, samples_per_prompt, **sampling):
    return [[Completion([1], [1, 2], [-0.5, -0.5], "\\boxed{1}", False) for _ in range(samples_per_prompt)]
            for _ in prompts]


@pytest.mark.parametrize("collector", ["spiral", "grpo"])
def test_spiral_logs_grader_incidents_per_step(monkeypatch, collector):
    monkeypatch.setattr(reward._GRADER, "stats", dict(reward._GRADER.stats))  # restored afterwards
    calls = []

    def flaky_reward(text, gold):  # every third grading has no verdict, as a timeout would
        calls.append(text)
        if len(calls) % 3:
            return 1.0
        reward._GRADER.stats["ungraded"] += 1
        reward._GRADER.stats["timeouts"] += 1
        return 0.0

    monkeypatch.setattr(spiral, "generate", _one_completion_per_prompt)
    monkeypatch.setattr(spiral, "reward", flaky_reward)
    draw = lambda: Problem(problem="p", answer="1")  # noqa: E731
    if collector == "spiral":
        out = spiral.collect_spiral(None, None, draw, batch_problems=1, num_search=4, set_size=2, num_sets=2,
                                    num_aggregations=3, max_new_tokens=4, rng=np.random.default_rng(0), max_draws=1)
    else:
        out = spiral.collect_grpo(None, None, draw, batch_problems=1, group_size=7, max_new_tokens=4, max_draws=1)
    assert len(calls) in (4 + 2 * 3, 7)
    assert out.metrics["grader/ungraded"] == out.metrics["grader/timeouts"] == len(calls) // 3
    assert out.metrics["grader/worker_restarts"] == out.metrics["grader/start_failures"] == 0
