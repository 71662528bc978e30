"""Retrying reads through transient storage errors, counting them, and clear errors for the rest.

Guarantees:
- `RetryPolicy.call` runs a read and retries it only when the error looks *transient* (a timeout,
  a refused or reset connection, a request that could not be sent, an HTTP 500/502/503/504 or
  429, throttling such as S3's ``SlowDown``). Errors that name a permanent cause (not found,
  access denied, no space left, an invalid request) are never retried, even if they also look
  transient.
- Retries wait with exponential backoff and deterministic jitter (the same call waits the same
  times in every run), at most ``attempts`` attempts, and no retry starts once ``deadline_s``
  passed since the first attempt: a read that keeps failing ends with an error, it never retries
  forever. The attempt in flight at the deadline is bounded by Lance: its request ``timeout``
  storage option (30 s unless set) for each of up to four sends of a request; Python cannot abort a
  Lance call in flight. So a read gives up at most ``deadline_s`` + 4 x ``timeout`` after it
  started (4 minutes with the defaults; docs/distributed.md has measured figures).
- Training reads of object stores see every failed request: they use a Lance handle whose own
  request retries are off (`lance_lightning.source.READ_CLIENT_OPTIONS`, unless the storage
  options set ``client_max_retries``), so this policy is the one layer that retries them.
- Every retry adds 1 to ``retries`` of the `StageClock` given (or the clock measuring the
  calling thread), 1 to ``throttles`` when the store asked to slow down (HTTP 429 or 503,
  ``SlowDown``, "too many requests"), and its wait to ``retry_wait_s``; these are the loader's
  ``data/retries``, ``data/throttles`` and ``data/retry_wait_s`` figures, also from worker
  processes.
- A read that fails for good raises `DataReadError` (a `RuntimeError`) naming the URI, the
  version and what was being read, how many attempts were made and whether the cause looked
  permanent, with the original error chained as ``__cause__``. Errors that are not storage
  errors (`ConfigError`, `RuntimeError` including `DataReadError`, `TypeError`, interrupts)
  pass through unchanged.
- Messages never contain credentials: they hold the URI, the version, positions and columns,
  and the first line of Lance's message (which names the object's URL, never keys).
"""

from __future__ import annotations

import logging
import re
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from lance_lightning.checks import check_int
from lance_lightning.errors import ConfigError, DataReadError
from lance_lightning.metrics.clock import StageClock, active_clock

T = TypeVar("T")

log = logging.getLogger(__name__)


def _status(*codes: str) -> str:
    """HTTP status codes as whole numbers: not digits of a name, a decimal or a duration (the store's
    messages carry request times such as ``in 404.35µs``)."""
    return rf"(?<![\w.])(?:{'|'.join(codes)})(?!\w|\.\d)"


#: Causes that never go away by waiting: checked first, they win over transient markers.
PERMANENT_PATTERNS = re.compile(
    rf"not found|no such file|no such key|nosuchkey|nosuchbucket|{_status('404', '403', '401')}|access ?denied|"
    r"forbidden|invalidaccesskeyid|signaturedoesnotmatch|no space left|os error 28|file too large|"
    r"os error 27|disk quota|out of range|does not exist|permission denied",
    re.IGNORECASE,
)
#: Causes that usually pass: timeouts, connection trouble, server-side 5xx and throttling.
TRANSIENT_PATTERNS = re.compile(
    r"timed? ?out|timeout|deadline has elapsed|connection (?:reset|refused|aborted|closed)|broken pipe|"
    r"error sending request|error trying to connect|incomplete ?message|unexpected eof|body error|"
    rf"connection error|temporar(?:y|ily)|try again|{_status('50[0234]', '429')}|internal ?server ?error|"
    r"service ?unavailable|bad gateway|gateway timeout|slow ?down|throttl|too many requests|"
    r"request rate|reduce your request rate",
    re.IGNORECASE,
)
#: Transient causes that mean "slow down": the store throttles this client.
THROTTLE_PATTERNS = re.compile(
    rf"{_status('429', '503')}|slow ?down|throttl|too many requests|request rate|service ?unavailable",
    re.IGNORECASE,
)


def _messages(error: BaseException) -> str:
    """The error's text and that of its causes (Lance wraps errors several levels deep)."""
    texts, seen = [], set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        texts.append(f"{type(current).__name__}: {current}")
        current = current.__cause__ or current.__context__
    return "\n".join(texts)


def is_storage_error(error: BaseException) -> bool:
    """Errors a storage read can raise: OSError (Lance IO), ValueError/ArrowInvalid (Lance errors)."""
    if isinstance(error, (ConfigError, RuntimeError)):
        return False
    try:
        import pyarrow as pa

        arrow: tuple[type[BaseException], ...] = (pa.lib.ArrowException,)
    except (ImportError, AttributeError):  # pragma: no cover - pyarrow is a dependency
        arrow = ()
    return isinstance(error, (OSError, ValueError, *arrow))


def is_transient(error: BaseException) -> bool:
    """True when ``error`` is a storage error whose message says it may pass by retrying."""
    if not is_storage_error(error):
        return False
    text = _messages(error)
    if PERMANENT_PATTERNS.search(text):
        return False
    return isinstance(error, TimeoutError) or bool(TRANSIENT_PATTERNS.search(text))


def is_throttle(error: BaseException) -> bool:
    """True when ``error`` is transient and the store asked this client to slow down."""
    return is_transient(error) and bool(THROTTLE_PATTERNS.search(_messages(error)))


def first_line(error: BaseException, limit: int = 400) -> str:
    text = str(error).strip()
    line = text.splitlines()[0] if text else type(error).__name__
    line = re.sub(r",? /home/runner/\S+|,? /rustc/\S+", "", line)  # Lance's Rust source locations
    return line if len(line) <= limit else line[: limit - 3] + "..."


def describe_rows(positions: np.ndarray | Sequence[int], method: str, columns: Sequence[str] | None) -> str:
    """``rows at positions 1024..2047 (scan), columns ['x']``: what a read was reading."""
    positions = np.asarray(positions)
    if len(positions) == 0:
        return describe_span(0, -1, 0, method, columns)
    return describe_span(int(positions.min()), int(positions.max()), len(positions), method, columns)


def describe_span(first: int, last: int, rows: int, method: str, columns: Sequence[str] | None) -> str:
    """`describe_rows` of ``rows`` rows whose positions lie in ``first..last``."""
    cols = f", columns {list(columns)}" if columns is not None else ""
    if rows == 0:
        return f"no rows ({method}){cols}"
    if last - first + 1 == rows:
        span = f"rows at positions {first}..{last}"
    else:
        span = f"{rows} rows at positions in {first}..{last}"
    return f"{span} ({method}){cols}"


@dataclass
class RetryPolicy:
    """How storage reads are retried.

    The defaults ride out a store that is gone for up to about two minutes (an outage, a
    restart, a burst of throttling), and report one gone for good after at most ``deadline_s``
    plus one attempt (see the module's guarantees).

    Args:
        attempts: Attempts per read, the first included (1 = never retry).
        initial_backoff_s: Wait before the first retry; it doubles with each retry.
        max_backoff_s: Longest single wait.
        deadline_s: No retry starts once this many seconds passed since a read's first attempt.
    """

    attempts: int = 40
    initial_backoff_s: float = 0.2
    max_backoff_s: float = 5.0
    deadline_s: float = 120.0

    def __post_init__(self) -> None:
        check_int("retry.attempts", self.attempts, 1, "use 1 to never retry, or e.g. 4")
        for name in ("initial_backoff_s", "max_backoff_s", "deadline_s"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not value >= 0
                or value == float("inf")
            ):
                raise ConfigError(
                    f"retry.{name}",
                    value,
                    "must be a finite number of seconds >= 0",
                    f"set `{name}` to e.g. {getattr(RetryPolicy, name)}",
                )
        if self.max_backoff_s < self.initial_backoff_s:
            raise ConfigError(
                "retry.max_backoff_s",
                self.max_backoff_s,
                f"is shorter than initial_backoff_s={self.initial_backoff_s}",
                "make max_backoff_s >= initial_backoff_s",
            )

    def backoff(self, retry: int, key: str = "") -> float:
        """Seconds to wait before retry number ``retry`` (1-based): exponential, jittered ±25%.

        The jitter is a hash of ``key`` and ``retry``, so it is the same in every run (and differs
        between reads, which spreads out retries of many readers hitting one store).
        """
        base = min(self.max_backoff_s, self.initial_backoff_s * 2 ** (retry - 1))
        unit = zlib.crc32(f"{key}#{retry}".encode()) / 0xFFFFFFFF  # [0, 1]
        return min(self.max_backoff_s, base * (0.75 + 0.5 * unit))

    def call(
        self, fn: Callable[[], T], *, what: str, uri: str, version: int | None = None, clock: StageClock | None = None
    ) -> T:
        """``fn()``, retried through transient storage errors; `DataReadError` when it fails for good.

        Args:
            fn: The read; it must be safe to repeat (reads of a pinned version are).
            what: What is read, for the error message, e.g. ``describe_rows(...)``.
            uri: The dataset URI (never include credentials).
            version: The pinned dataset version, if known.
            clock: Where ``retries``, ``throttles`` and ``retry_wait_s`` are counted; default: the
                clock measuring this thread.
        """
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn()
            except BaseException as error:  # noqa: BLE001 - classified below, re-raised otherwise
                if not is_storage_error(error):
                    raise
                transient = is_transient(error)
                elapsed = time.monotonic() - started
                wait = self.backoff(attempt, f"{uri}|{what}") if transient else 0.0
                if transient and attempt < self.attempts and elapsed + wait < self.deadline_s:
                    counter = clock if clock is not None else active_clock()
                    if counter is not None:
                        counter.add("retries", 1)
                        counter.add("retry_wait_s", wait)
                        if is_throttle(error):
                            counter.add("throttles", 1)
                    log.warning(
                        "transient error reading %s of %s (attempt %d of %d), retrying in %.2f s: %s",
                        what,
                        uri,
                        attempt,
                        self.attempts,
                        wait,
                        first_line(error),
                    )
                    time.sleep(wait)
                    continue
                raise self._failure(error, what, uri, version, attempt, transient, elapsed) from error

    def _failure(
        self,
        error: BaseException,
        what: str,
        uri: str,
        version: int | None,
        attempt: int,
        transient: bool,
        elapsed: float,
    ) -> DataReadError:
        at = f"{uri} @ version {version}" if version is not None else uri
        if transient:
            limit = "attempts" if attempt >= self.attempts else f"deadline_s={self.deadline_s:g}"
            why = (
                f"the store kept failing with a transient error; gave up after {attempt} attempt(s) over "
                f"{elapsed:.1f} s ({limit} reached)"
            )
            fix = (
                "check that the store is reachable (endpoint, network), or allow more time with "
                "RetryPolicy(attempts=..., deadline_s=...)"
            )
        else:
            why = f"the error is permanent, so it was not retried (attempt {attempt})"
            fix = (
                "check that the dataset and this version still exist at the URI (a cleanup or deletion "
                "removes files of old versions) and that the credentials allow reading it"
            )
        message = f"could not read {what} of {at}: {first_line(error)}. {why}. Fix: {fix}"
        return DataReadError(message, uri=uri, version=version, what=what, attempts=attempt, transient=transient)


#: The policy reads use unless given another one.
DEFAULT_POLICY = RetryPolicy()
