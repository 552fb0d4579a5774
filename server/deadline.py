"""When a round may close without every worker's push: the round deadline.

``--round-timeout`` takes three forms:

* ``auto`` (the default): a deadline that a healthy run does not reach, so that a
  worker that stops answering (a Byzantine one may) costs one deadline instead of the
  run: ``AUTO_FACTOR`` times the median *honest span* of the last ``AUTO_HISTORY``
  rounds, at least ``AUTO_FLOOR_S`` and at most ``AUTO_MAX_S``. A round's honest span
  runs from its (q + 1)-th push to its (n - q)-th: the q Byzantine workers the run
  tolerates can stretch it neither by pushing late (a span to the last push would let
  one worker that pushes just before each deadline grow it tenfold a round) nor by
  pushing early (from the first push, one that pushes each round the moment it opens
  would make the span the honest workers' whole computing time, and the deadline ten
  times that). Until a round has reached n - q pushes the wait is ``AUTO_FIRST_S``,
  counted from the round's (q + 1)-th push or the latest first HELLO of a worker,
  whichever is later: workers still starting (seconds apart on a loaded host, minutes
  where a node pulls an image) keep the first round open;
* SECONDS: a fixed deadline, counted from the round's (q + 1)-th push (from the first,
  an early Byzantine push would choose which honest pushes come too late);
* ``none``: every round waits for all n pushes, the paper's strictly synchronous SGD
  (Xie et al. 2018, Algorithm 1).

Every deadline is counted from a round's (q + 1)-th push, the first that the q
Byzantine workers cannot send alone (or its (n - q)-th, if that comes first: a rule
that takes q >= n - q); a round needs its quorum, at least n - q pushes, to close
anyway.

A round that closes at its deadline aggregates the pushes that are in if they reach the
quorum; the workers it aggregated are recorded (``server-<s>.jsonl``) so the reference
engine replays it bit for bit (``ps/reference/participation.py``).
"""

from __future__ import annotations

import statistics
from collections import deque

from common.errors import ConfigError

AUTO = "auto"
NONE = "none"
AUTO_FACTOR = 10.0
AUTO_FLOOR_S = 5.0
AUTO_FIRST_S = 30.0
AUTO_MAX_S = 600.0
AUTO_HISTORY = 16


class RoundDeadline:
    """How long a round may wait for its missing pushes after its (q + 1)-th:
    ``fixed_s`` seconds, or (None) adaptively from the spans :meth:`observe` is given."""

    def __init__(self, fixed_s: float | None = None) -> None:
        self.fixed_s = fixed_s
        self.spans: deque[float] = deque(maxlen=AUTO_HISTORY)

    @classmethod
    def parse(cls, text: str) -> RoundDeadline | None:
        """The deadline ``--round-timeout TEXT`` asks for (None: ``none``);
        ``ConfigError`` for anything but ``auto``, ``none`` or positive seconds."""
        value = str(text).strip().lower()
        if value == AUTO:
            return cls()
        if value == NONE:
            return None
        try:
            seconds = float(value)
        except ValueError:
            raise ConfigError(f"--round-timeout must be auto, none or seconds, got "
                              f"{text!r}") from None
        if not seconds > 0 or seconds == float("inf"):
            raise ConfigError(f"--round-timeout must be a positive number of seconds (or auto, "
                              f"none), got {text!r}")
        return cls(seconds)

    @property
    def adaptive(self) -> bool:
        return self.fixed_s is None

    @property
    def learning(self) -> bool:
        """Adaptive, and no round has told it yet how long a healthy one takes."""
        return self.fixed_s is None and not self.spans

    def seconds(self) -> float:
        """The wait allowed now (from the round's (q + 1)-th push; while ``learning``,
        from the later of that and the latest first HELLO of a worker)."""
        if self.fixed_s is not None:
            return self.fixed_s
        if not self.spans:
            return AUTO_FIRST_S
        return min(AUTO_MAX_S, max(AUTO_FLOOR_S, AUTO_FACTOR * statistics.median(self.spans)))

    def observe(self, honest_span_s: float) -> None:
        """A round reached its (n - q)-th push ``honest_span_s`` after its (q + 1)-th."""
        self.spans.append(max(0.0, honest_span_s))
