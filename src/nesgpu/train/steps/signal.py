"""Steps that carry no signal: every member tied, so the update's weights are all zero and the step changes
nothing. Each ES step logs ``no_signal`` (1 or 0); :class:`SignalWatch` says so on the console, early, when
most steps have none, with what to change."""

from __future__ import annotations

from collections import deque

# the steps looked at: the first warning can come once this many have run; the share is over the latest ones
WINDOW = 10
FIRST_LOOK = 5


class SignalWatch:
    """Counts a run's steps without signal and warns once when more than half of the latest ``WINDOW`` (at
    least ``FIRST_LOOK`` of them) carried none.

    Args:
        log: where the warning goes (the run's console).
        sigma: the run's sigma, named in the advice (``"auto"``: chosen by the probe).
        rows: the metrics rows of a resumed run (their ``no_signal`` values are counted as this run's).
    """

    def __init__(self, log, sigma, rows=()):
        self.log, self.sigma = log, sigma
        self.latest: deque[bool] = deque(maxlen=WINDOW)
        self.steps = self.silent = 0
        self.warned = False
        for row in rows:
            if row.get("no_signal") not in (None, ""):
                self._count(bool(float(row["no_signal"])))

    def _count(self, silent: bool) -> None:
        self.latest.append(silent)
        self.steps += 1
        self.silent += silent

    def see(self, step: int, row: dict) -> None:
        """The row of a finished step (``no_signal`` absent: not an ES step, nothing counted)."""
        if row.get("no_signal") is None:
            return
        self._count(bool(row["no_signal"]))
        quiet = sum(self.latest)
        if self.warned or len(self.latest) < FIRST_LOOK or 2 * quiet <= len(self.latest):
            return
        self.warned = True
        probed = self.sigma == "auto"
        raise_it = "raise --sigma" if probed else ("raise --sigma (or use --sigma auto, which probes for the sigma at "
                                                   "which members differ)")
        self.log(f"warning: {quiet} of the last {len(self.latest)} steps (to step {step}) carried no signal: every "
                 f"member of the population scored the same, so those steps changed nothing. The population does "
                 f"not spread at sigma {row['sigma']:.3g}{' (probed)' if probed else ''}: {raise_it}; for a reward, "
                 f"also sample (--temperature 0.7 --generations 4), give more prompts per step (--batch-size), or "
                 f"score partial answers")

    @property
    def share(self) -> float | None:
        """The share of the run's steps without signal (None before any ES step)."""
        return self.silent / self.steps if self.steps else None


__all__ = ["FIRST_LOOK", "SignalWatch", "WINDOW"]
