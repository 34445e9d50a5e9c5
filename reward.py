"""The verifiable reward r(x, y) in {0, 1}: the last \\boxed{} answer of y, graded against the gold by math-verify.

Rules, in order: Unicode math is rewritten as LaTeX (½ -> \\frac{1}{2}); identical answers are equivalent; a hedge (a
box holding several answers) is equivalent to nothing else; otherwise both answers must parse as one LaTeX expression
each and math-verify must find them equal. A list ("1, 3", "1 or 3") is read as a set: it matches a list gold only.

math-verify runs in a separate worker process with a hard time limit, so no answer can hang or crash training. A
comparison without a verdict (a timeout, no worker) scores 0, is never cached, and is counted in `grader_stats()`.
The limits count the worker's CPU time, not wall-clock time: a verdict must not depend on how busy the machine is
(under load, a 1 s wall-clock limit turned correct answers into timeouts, so the same command gave other results).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import re
import select
import subprocess
import sys
import threading
import time
import unicodedata
import warnings

MAX_ANSWER_CHARS = 1000  # a longer \boxed{} answer scores 0 unparsed (longest bundled gold answer: 159 characters)
GRADE_TIMEOUT_S = 5.0  # hard limit per comparison, worker CPU seconds: the worker is killed and restarted past it
GRADE_WALL_TIMEOUT_S = 300.0  # the same in wall-clock seconds, a backstop (and the limit where /proc is missing)
WORKER_START_TIMEOUT_S = 120.0  # importing sympy and math-verify; generous for a busy machine
START_ATTEMPTS = 3  # start-up tries per round, START_BACKOFF_S, then twice that, apart
START_BACKOFF_S = 0.5
START_RETRY_AFTER_S = 30.0  # after a failed round, score 0 without trying for this long
_CPU_LIMIT_S = 2.0  # the worker's own limit per comparison, CPU seconds (ITIMER_PROF), interrupting Python code

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


def _closing_brace(text: str, start: int) -> int | None:
    """Index of the "}" closing the group whose content starts at `start`; escaped braces do not nest."""
    depth, position = 1, start
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
                return position
        position += 1
    return None


def extract_answer(text: str) -> str | None:
    """The final answer of a completion y, as graded by r(x, y): the content of its last \\boxed{...} or \\fbox{...}.

    The last top-level box: a box inside it is part of its content. Nested braces are followed; "\\boxed {x}" (a
    space) counts. None if there is no box, if the last one is never closed (a truncated completion), or if it is
    empty. Linear time on any input.
    """
    if not isinstance(text, str):
        return None
    answer, position = None, 0
    while box := _BOXED.search(text, position):
        end = _closing_brace(text, box.end())
        if end is None:
            return None
        answer, position = text[box.end():end].strip(), end + 1
    return answer or None


_HASH_ANSWER = re.compile(r"####\s*\$?\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)")


def hash_answer(text: str) -> str | None:
    """gsm8k's final answer: the number after the last "####" ("... #### 72"), commas and a $ dropped, as verl's
    gsm8k scorer (verl/utils/reward_score/gsm8k.py, strict) reads a completion, and as gsm8k's answer column ends.
    None without one."""
    found = _HASH_ANSWER.findall(text) if isinstance(text, str) else []
    return found[-1].replace(",", "") if found else None


# ----------------------------------------------------------------------------------------------------------------------
# Unicode math and hedges: plain string rules, applied before math-verify sees an answer

_SUPERSCRIPTS = "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁼⁽⁾ⁿⁱ"
_SUBSCRIPTS = "₀₁₂₃₄₅₆₇₈₉₊₋₌₍₎"
_SCRIPT_RUN = re.compile(f"([{_SUPERSCRIPTS}]+)|([{_SUBSCRIPTS}]+)")
_FROM_SUPERSCRIPT = str.maketrans(_SUPERSCRIPTS, "0123456789+-=()ni")
_FROM_SUBSCRIPT = str.maketrans(_SUBSCRIPTS, "0123456789+-=()")
_SYMBOLS = str.maketrans({  # after NFKC, which leaves these alone; a trailing space ends the command (\pi x)
    "\u2212": "-", "π": "\\pi ", "θ": "\\theta ", "∞": "\\infty ", "×": "\\times ", "÷": "\\div ", "·": "\\cdot ",
    "⋅": "\\cdot ", "≤": "\\le ", "≥": "\\ge ", "≠": "\\ne ", "±": "\\pm ", "∓": "\\mp ", "°": "^\\circ ",
    "∪": "\\cup ", "∩": "\\cap ", "∈": "\\in ", "⁄": "/"})
_ROOT = re.compile(r"([√∛∜])\s*(\{[^{}]*\}|\([^()]*\)|\d+(?:\.\d+)?|\\[A-Za-z]+(?:\{[^{}]*\})?|[A-Za-z])")
_ROOT_INDEX = {"√": "", "∛": "[3]", "∜": "[4]"}


def _vulgar_fraction(char: str) -> str:
    if not unicodedata.decomposition(char).startswith("<fraction>"):
        return char
    numerator, _, denominator = unicodedata.normalize("NFKC", char).partition("\u2044")  # ½ -> "1⁄2"
    return f"\\frac{{{numerator}}}{{{denominator}}}" if numerator and denominator else char


def normalize_unicode(text: str) -> str:
    """Unicode math as the LaTeX math-verify reads: ½ -> \\frac{1}{2}, x² -> x^{2}, √2 -> \\sqrt{2}, π -> \\pi,
    full-width characters -> ASCII (NFKC), − -> -, × ÷ · -> \\times \\div \\cdot, ≤ ≥ ≠ -> \\le \\ge \\ne,
    ∞ -> \\infty. ASCII text is returned unchanged.
    """
    if text.isascii():
        return text
    # Scripts and fractions first: NFKC would turn x² into x2 and ½ into 1⁄2.
    text = _SCRIPT_RUN.sub(lambda m: f"^{{{m[1].translate(_FROM_SUPERSCRIPT)}}}" if m[1]
                           else f"_{{{m[2].translate(_FROM_SUBSCRIPT)}}}", text)
    text = "".join(map(_vulgar_fraction, text))
    text = unicodedata.normalize("NFKC", text).translate(_SYMBOLS)
    while (rooted := _ROOT.sub(_root, text)) != text:  # inner roots first: √√2 -> √\sqrt{2} -> \sqrt{\sqrt{2}}
        text = rooted
    return text


def _root(match: re.Match) -> str:
    operand = match[2][1:-1] if match[2].startswith("{") else match[2]
    return f"\\sqrt{_ROOT_INDEX[match[1]]}{{{operand}}}"


_TIE = re.compile(r"(?<!\\)~")  # LaTeX's non-breaking space
_DOLLAR = re.compile(r"(?<!\\)\$")  # an unescaped $ ends a formula (\$ is a dollar sign)
_TEXT_GROUP = re.compile(r"\\(?:text(?:rm|bf|it|sf|tt|normal)?|mbox|mathrm|operatorname)\s*\{([^{}]*)\}")
_LONE_NUMBER = re.compile(r"(?<![A-Za-z0-9])\d")  # "(or 1)" holds one; "A5" does not


def _clean(answer: str) -> str:
    """The answer as graded: Unicode rewritten, ~ as a space, a box or $...$ around it all removed, and trailing
    "." "," ";" ":" dropped."""
    answer = _TIE.sub(" ", normalize_unicode(answer)).strip()  # math-verify does not parse 5~\text{cm}
    while (box := _BOXED.match(answer)) and _closing_brace(answer, box.end()) == len(answer) - 1:
        answer = answer[box.end():-1].strip()
    formulas = [part for part in _DOLLAR.split(answer) if part.strip()]
    if len(formulas) == 1:
        answer = formulas[0].strip()
    while answer[-1:] in (".", ",", ";", ":") and answer[-2:-1] != "\\":  # "\boxed{5.}" ends a sentence
        answer = answer[:-1].rstrip()
    return answer


def hedge(answer: str) -> str | None:
    """Why `answer` holds several answers, or None. Checked on cleaned answers, together with two rules in the worker:
    the answer must parse as one LaTeX expression (math-verify's fallback would grade the last number of "1 \\lor 3"
    or "1 \\\\ 3"), and every side of "1 = 3" that has no unknowns must equal the gold.
    """
    if len([part for part in _DOLLAR.split(answer) if part.strip()]) > 1:
        return "formulas split by $"
    if _BOXED.search(answer):
        return "a box inside the box"
    for group in _TEXT_GROUP.finditer(answer):
        if _LONE_NUMBER.search(group[1]) and group[0] != answer:
            return "a number inside \\text{}, which math-verify drops ungraded"
    return None


def answers_equivalent(answer_a: str, answer_b: str) -> bool:
    """Whether two final answers are mathematically the same, per math-verify with `answer_a` as the gold answer.

    Identical cleaned strings are equivalent without parsing; a hedge is equivalent to nothing else; non-strings,
    empty answers and answers longer than MAX_ANSWER_CHARS to nothing. Never raises, never hangs. Verdicts are cached;
    a comparison without one (timeout, no worker) is False and not cached.
    """
    if not isinstance(answer_a, str) or not isinstance(answer_b, str):
        return False
    if len(answer_a) > MAX_ANSWER_CHARS or len(answer_b) > MAX_ANSWER_CHARS:
        return False
    answer_a, answer_b = _clean(answer_a), _clean(answer_b)
    if not answer_a or not answer_b or len(answer_a) > MAX_ANSWER_CHARS or len(answer_b) > MAX_ANSWER_CHARS:
        return False
    if answer_a == answer_b:
        return True
    if hedge(answer_a) or hedge(answer_b):
        return False
    try:
        return _verify_cached(answer_a, answer_b)
    except _NoVerdict:
        return False


def reward(completion_text: str, gold_answer: str) -> float:
    """Verifiable reward r(x, y): 1.0 if the last \\boxed{} answer of y equals the gold answer, else 0.0.

    answers_equivalent(gold, answer), gold first. Never raises on any input and never hangs: the worst case is
    GRADE_TIMEOUT_S plus a worker restart. If the worker cannot start, it scores 0, warns once and counts.
    """
    answer = extract_answer(completion_text)
    if answer is None:
        return 0.0
    return 1.0 if answers_equivalent(gold_answer, answer) else 0.0


def grader_stats() -> dict[str, int]:
    """Counts since start: comparisons scored 0 without a verdict ("ungraded"), of which "timeouts" ran out of time;
    "worker_restarts" (killed after a hard timeout or interruption, or found dead); "start_failures" (failed starts).
    """
    return dict(_GRADER.stats)


def check_grader() -> str | None:
    """Start the worker now: None if it runs, else why not (e.g. math-verify not installed). For start-up checks."""
    return _GRADER.start_error()


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` from /proc (Linux), or None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


class _NoVerdict(Exception):
    """A comparison that ended without a verdict; raised so that lru_cache, which stores only results, skips it."""


@functools.lru_cache(maxsize=100_000)
def _verify_cached(gold: str, answer: str) -> bool:
    verdict = _GRADER.equivalent(gold, answer)
    if verdict is None:
        raise _NoVerdict
    return verdict


# ----------------------------------------------------------------------------------------------------------------------
# The worker: a fresh interpreter that imports only math-verify (not torch, not this module). A `multiprocessing`
# spawn/forkserver child would re-import the parent's __main__ (train.py, with torch and transformers) first, and a
# forked child would inherit torch's threads. In its own main thread math-verify's signal.alarm timeouts work; the
# parent's hard limit covers what they cannot interrupt (long C-level computations, e.g. huge integer powers).
# Protocol: one JSON line [request id, gold, answer] in, one line "<id> 1|0|T" out (T: a timeout, no verdict).

_WORKER_SOURCE = f"""
import json, logging, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it kills this worker and starts another
out = sys.stdout.buffer
try:
    try:
        import resource  # a runaway computation must not eat the training machine's memory
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    except Exception:
        pass
    from math_verify import LatexExtractionConfig, parse, verify
    from math_verify import grader as _grader, parser as _parser
    from math_verify.errors import TimeoutException
    from sympy import And, Eq
    _grader.TIMEOUT_WARNING_SHOWN = _parser.TIMEOUT_WARNING_SHOWN = True  # its wall-clock alarms are off: ours below
except BaseException as error:
    out.write(("error " + type(error).__name__ + ": " + str(error)).encode("ascii", "replace") + b"\\n")
    sys.exit(1)

class TimeoutLog(logging.Handler):  # math-verify catches its own timeouts and only logs them
    seen = False
    def emit(self, record):
        TimeoutLog.seen = TimeoutLog.seen or "timeout" in record.getMessage().lower()

log = logging.getLogger("math_verify")
log.addHandler(TimeoutLog())
log.propagate = False
LATEX_ONLY = [LatexExtractionConfig()]  # no fallback to the last number of an answer that is not one expression

class CpuLimit(BaseException):  # a BaseException: math-verify's `except Exception` must not swallow it
    pass

def over_limit(signum, frame):
    raise CpuLimit

signal.signal(signal.SIGPROF, over_limit)

def read(latex):
    return parse("$" + latex + "$", extraction_config=LATEX_ONLY, parsing_timeout=None)

def equations(expr):
    parts = expr.args if isinstance(expr, And) else (expr,)
    return list(parts) if parts and all(isinstance(part, Eq) for part in parts) else []

def grade(gold, answer):
    gold, answer = read(gold), read(answer)
    ok = verify(gold, answer, timeout_seconds=None)
    if ok and answer and not (gold and equations(gold[0])):  # math-verify grades only the last side of "1 = 3"
        sides = [side for eq in equations(answer[0]) for side in eq.args if getattr(side, "is_number", False)]
        ok = all(verify(gold, [side], timeout_seconds=None) for side in sides)
    return ok

out.write(b"ready\\n"); out.flush()
for line in sys.stdin.buffer:
    TimeoutLog.seen = False
    try:
        request_id, gold, answer = json.loads(line)
    except Exception:
        continue  # never sent by the parent; it would time out and restart this worker
    try:
        signal.setitimer(signal.ITIMER_PROF, {_CPU_LIMIT_S})  # CPU time: the same verdict on a busy machine
        try:
            verdict = b"1" if grade(gold, answer) else b"T" if TimeoutLog.seen else b"0"
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
    except (TimeoutException, CpuLimit):
        verdict = b"T"
    except BaseException:  # RecursionError, MemoryError, ...: no parse, so not equivalent
        verdict = b"0"
    out.write(str(request_id).encode() + b" " + verdict + b"\\n"); out.flush()
"""


class _GradingWorker:
    """A persistent math-verify process, one request at a time (a lock), usable from any thread and across fork."""

    def __init__(self):
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._buffer = b""
        self._request_id = 0
        self._retry_after = 0.0  # monotonic time before which a failed start is not retried
        self._start_error = ""  # why the last round of starts failed
        self._warned: set[str] = set()
        self.stats = {"ungraded": 0, "timeouts": 0, "worker_restarts": 0, "start_failures": 0}

    def equivalent(self, gold: str, answer: str) -> bool | None:
        """math-verify's verdict, or None without one (timeout, no worker)."""
        with self._lock:
            try:
                verdict = self._ask(gold, answer) if self._ensure_started() else None
            except BaseException:  # Ctrl-C or a caller's timeout: the reply must never reach the next request
                self._kill(restart=True)
                raise
            if verdict is None:
                self.stats["ungraded"] += 1
            return verdict

    def _ask(self, gold: str, answer: str) -> bool | None:
        self._request_id += 1
        prefix = b"%d " % self._request_id
        cpu = functools.partial(_cpu_seconds, self._process.pid)
        cpu_start = cpu()
        # The hard limit counts the worker's CPU time where /proc tells it (load-independent), else wall time.
        over = (lambda: (cpu() or 0.0) - cpu_start >= GRADE_TIMEOUT_S) if cpu_start is not None else None
        deadline = time.monotonic() + (GRADE_WALL_TIMEOUT_S if cpu_start is not None else GRADE_TIMEOUT_S)
        try:  # ASCII JSON: control characters are escaped, so one request is one line
            self._process.stdin.write(json.dumps([self._request_id, gold, answer]).encode("ascii") + b"\n")
            while (line := self._read_line(deadline, over)) is not None and not line.startswith(prefix):
                pass  # a stale reply to an earlier request: discard
        except OSError:  # the worker died (e.g. out of memory)
            line = None
        if line is None:  # past the hard limit, or the worker died
            self.stats["timeouts"] += self._process.poll() is None
            self._kill(restart=True)
            return None
        verdict = line[len(prefix):]
        self.stats["timeouts"] += verdict == b"T"
        return None if verdict == b"T" else verdict == b"1"

    def _ensure_started(self) -> bool:
        if self._process is not None and self._process.poll() is None:
            return True
        if self._process is not None:  # it died between requests
            self._kill(restart=True)
        if time.monotonic() < self._retry_after:
            return False
        for attempt in range(START_ATTEMPTS):
            if attempt:
                time.sleep(START_BACKOFF_S * 2 ** (attempt - 1))
            error = self._start()
            if error is None:
                return True
            self.stats["start_failures"] += 1
        self._retry_after, self._start_error = time.monotonic() + START_RETRY_AFTER_S, error
        if error not in self._warned:
            self._warned.add(error)
            warnings.warn(f"reward.py: the math-verify grader did not start ({error}); rewards score 0 until it does "
                          f"(see reward.grader_stats())", RuntimeWarning, stacklevel=2)
        return False

    def _start(self) -> str | None:
        """Start a worker; None once it is ready, else why not."""
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-c", _WORKER_SOURCE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, bufsize=0,
                start_new_session=True)  # a terminal's Ctrl-C reaches the parent only; the parent kills the worker
        except OSError as error:
            return f"cannot run {sys.executable}: {error}"
        self._buffer = b""
        deadline = time.monotonic() + WORKER_START_TIMEOUT_S
        line = self._read_line(deadline)
        if line == b"ready":
            return None
        if line is None and time.monotonic() < deadline:  # its output ended early: it is exiting
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=5)
        exit_status = self._process.poll()
        self._kill()
        if line and line.startswith(b"error "):
            return f"{line[6:].decode('ascii', 'replace')}; is math-verify installed for {sys.executable}?"
        if exit_status is None:
            return f"not ready within {WORKER_START_TIMEOUT_S:g} s"
        return f"the worker exited with status {exit_status} during start-up"

    def _read_line(self, deadline: float, over=None) -> bytes | None:
        """The worker's next output line, or None on end of file, past `deadline` (wall clock), or once `over()`
        says the worker spent its CPU limit (checked every 0.1 s while waiting)."""
        poller = select.poll()  # poll, not select: no limit on the descriptor number
        poller.register(self._process.stdout, select.POLLIN)
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (over is not None and over()):
                return None
            if not poller.poll(1000 * (remaining if over is None else min(remaining, 0.1))):
                continue
            chunk = os.read(self._process.stdout.fileno(), 4096)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def _kill(self, restart: bool = False) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        self.stats["worker_restarts"] += restart
        process.kill()
        process.wait()
        process.stdin.close()
        process.stdout.close()

    def start_error(self) -> str | None:
        """Start now, pause or not: None if a worker runs, else why the last start failed."""
        with self._lock:
            self._retry_after = 0.0
            return None if self._ensure_started() else self._start_error

    def close(self) -> None:
        if self._lock.acquire(blocking=False):  # else a thread is grading; the worker ends at EOF when we exit
            try:
                self._kill()
            finally:
                self._lock.release()

    def after_fork_in_child(self) -> None:
        """A forked child gets a fresh lock (the parent's may be held by a thread that does not exist here) and no
        worker: the parent's stays the parent's."""
        self._lock = threading.Lock()
        process, self._process = self._process, None
        self._buffer = b""
        if process is not None:
            process.stdin.close()
            process.stdout.close()
            process.returncode = -1  # not our child: never wait for it (its pid may be reused by one of ours)


_GRADER = _GradingWorker()
atexit.register(_GRADER.close)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_GRADER.after_fork_in_child)


if __name__ == "__main__":  # a library: prints what it holds, runs nothing (cli.library_main: an import cycle)
    print(__doc__)
