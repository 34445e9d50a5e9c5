"""The verifiable reward r(x, y) in {0, 1}: the last \\boxed{} answer of y, graded against the gold answer by math-verify.

math-verify runs in a separate worker process with a hard time limit, so no answer can hang or crash training.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import re
import select
import subprocess
import sys
import threading
import time

MAX_ANSWER_CHARS = 1000  # a longer \boxed{} answer scores 0 unparsed (longest bundled gold answer: 159 characters)
GRADE_TIMEOUT_S = 5.0  # hard limit per comparison: the worker is killed and restarted past it
WORKER_START_TIMEOUT_S = 120.0  # importing sympy and math-verify takes ~0.5 s; generous for a busy machine
_INNER_TIMEOUT_S = 1  # math-verify's own signal.alarm limits (whole seconds) for each parse and comparison

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


def extract_answer(text: str) -> str | None:
    """The final answer of a completion y, as graded by r(x, y): the content of its last \\boxed{...} or \\fbox{...}.

    Nested braces are followed; "\\boxed {x}" (a space) counts; escaped braces \\{ \\} do not nest. None if there is
    no \\boxed{}, if the last one is never closed (a truncated completion: the earlier ones are not answers the model
    committed to), or if it is empty. Runs in linear time on any input.
    """
    if not isinstance(text, str):
        return None
    last = None
    for last in _BOXED.finditer(text):
        pass
    if last is None:
        return None
    depth, position = 1, last.end()
    while position < len(text):
        char = text[position]
        if char == "\\":
            position += 2  # skip the escaped character (\{, \}, \\)
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                answer = text[last.end() : position].strip()
                return answer or None
        position += 1
    return None


def answers_equivalent(answer_a: str, answer_b: str) -> bool:
    """Whether two final answers are mathematically the same, per math-verify with `answer_a` as the gold answer.

    Both are parsed as LaTeX math ("$" + answer + "$"); math_verify.verify(gold, prediction) is not symmetric
    (gold first). Identical strings (after stripping whitespace) are equivalent without parsing. Never raises, never
    hangs: non-strings, empty answers and answers longer than MAX_ANSWER_CHARS are not equivalent, and a comparison
    that takes longer than GRADE_TIMEOUT_S counts as not equivalent. Results are cached, timeouts included
    (majority voting compares the same answers many times; an explosive answer costs its timeout only once).
    """
    if not isinstance(answer_a, str) or not isinstance(answer_b, str):
        return False
    answer_a, answer_b = answer_a.strip(), answer_b.strip()
    if not answer_a or not answer_b or len(answer_a) > MAX_ANSWER_CHARS or len(answer_b) > MAX_ANSWER_CHARS:
        return False
    if answer_a == answer_b:
        return True
    return _verify_cached(answer_a, answer_b)


def reward(completion_text: str, gold_answer: str) -> float:
    """Verifiable reward r(x, y): 1.0 if the last \\boxed{} answer of y equals the gold answer, else 0.0.

    Grading: math_verify.verify(parse("$" + gold + "$"), parse("$" + answer + "$")), gold first, in a worker
    process with a hard time limit (see `answers_equivalent`). Never raises on any input and never hangs: the worst
    case is GRADE_TIMEOUT_S plus a worker restart. The common case costs milliseconds (measured on a busy 2-core
    CPU: integers ~1 ms, fractions ~8 ms; ~0.5-1 s once, to start the worker). The only exception is a
    RuntimeError when the worker cannot start at all (math-verify not installed): silent zero rewards would be worse.
    """
    answer = extract_answer(completion_text)
    if answer is None:
        return 0.0
    return 1.0 if answers_equivalent(gold_answer, answer) else 0.0


@functools.lru_cache(maxsize=100_000)
def _verify_cached(gold: str, answer: str) -> bool:
    return _GRADER.equivalent(gold, answer)


# The worker is a fresh interpreter that imports only math-verify (not torch, not this module): a `multiprocessing`
# spawn/forkserver child would re-import the parent's __main__ (train.py, with torch and transformers) first, and
# a forked child would inherit torch's threads. In its own main thread math-verify's signal.alarm timeouts work;
# the parent's hard limit covers what they cannot interrupt (long C-level computations, e.g. huge integer powers).
_WORKER_SOURCE = f"""
import json, logging, sys
logging.disable(logging.CRITICAL)  # math-verify logs every timeout as a warning
try:
    import resource  # a runaway computation must not eat the training machine's memory
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
except Exception:
    pass
from math_verify import parse, verify
out = sys.stdout.buffer
out.write(b"ready\\n"); out.flush()
for line in sys.stdin.buffer:
    try:
        gold, answer = json.loads(line)
        gold = parse("$" + gold + "$", parsing_timeout={_INNER_TIMEOUT_S})
        answer = parse("$" + answer + "$", parsing_timeout={_INNER_TIMEOUT_S})
        ok = verify(gold, answer, timeout_seconds={_INNER_TIMEOUT_S})
    except BaseException:  # math-verify's TimeoutException is a BaseException; RecursionError, MemoryError, ...
        ok = False
    out.write(b"1\\n" if ok else b"0\\n"); out.flush()
"""


class _GradingWorker:
    """A persistent math-verify process, one request at a time (a lock), usable from any thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._owner_pid = os.getpid()
        self._buffer = b""

    def equivalent(self, gold: str, answer: str) -> bool:
        request = json.dumps([gold, answer]).encode("ascii") + b"\n"  # ASCII: control characters are escaped
        with self._lock:
            if self._process is None or self._process.poll() is not None or self._owner_pid != os.getpid():
                self._start()
            try:
                self._process.stdin.write(request)
                self._process.stdin.flush()
                reply = self._read_line(time.monotonic() + GRADE_TIMEOUT_S)
            except OSError:  # the worker died (e.g. out of memory)
                reply = None
            if reply is None:
                self._stop()
                return False
            return reply == b"1"

    def _start(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-c", _WORKER_SOURCE],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0,
        )
        self._owner_pid = os.getpid()
        self._buffer = b""
        if self._read_line(time.monotonic() + WORKER_START_TIMEOUT_S) != b"ready":
            self._stop()
            raise RuntimeError(f"the grading worker did not start; is math-verify installed for {sys.executable}?")

    def _read_line(self, deadline: float) -> bytes | None:
        """The worker's next output line, or None on timeout or end of file."""
        poller = select.poll()  # poll, not select: no limit on the descriptor number
        poller.register(self._process.stdout, select.POLLIN)
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not poller.poll(remaining * 1000):
                return None
            chunk = os.read(self._process.stdout.fileno(), 4096)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def _stop(self) -> None:
        if self._process is not None and self._owner_pid == os.getpid():
            self._process.kill()
            self._process.wait()
        self._process = None

    def close(self) -> None:
        with self._lock:
            self._stop()


_GRADER = _GradingWorker()
atexit.register(_GRADER.close)
