"""First-token waits predicted, so that a class's objective (``ttft_s``) can be enforced, and checked
against what happened, so that the prediction stays honest.

The model (``FairScheduler._predicted_wait``): a request that would go at once waits only for its
first token's delay after dispatch (measured, smoothed); else for the pool's next dispatch, then for
its leaf to be served what is ahead of it at the leaf's share of the pool's measured service rate.

The model leaves things out (bursts, an engine's full KV, preemptions), so a class admits a request
when the model plus the class's margin is within its objective, and the margin is tracked from what
happened to the requests it admitted: a miss raises it by ``q`` steps, a met objective lowers it by
``1 - q`` (a stochastic-approximation quantile: it settles where a fraction ``q`` of admitted requests
meet the objective, whatever the model's error). While nothing is admitted the margin relaxes toward
none, and a class that admitted nothing for ``PROBE_AFTER_S`` admits its next request as a probe, so
that shedding cannot feed on itself.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

RATE_WINDOW_S = 10.0  # the pool's rates: over this many seconds of samples
EWMA_ALPHA = 0.1  # the first-token delay: how much each new observation moves it
TARGET = 0.97  # the share of admitted requests that should meet the objective
MARGIN_STEP = 0.1  # of the objective: how far one admitted request's outcome moves the margin
MARGIN_RELAX_S = 30.0  # while no admitted request's first token comes, the margin halves this often
PROBE_AFTER_S = 30.0  # a class that admitted nothing for this long admits its next request whatever the model


class RateMeter:
    """Something cumulative (service in cost units, dispatches) per second over a sliding window of
    (time, total) samples."""

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self._window_s = window_s
        self._samples: deque[tuple[float, float]] = deque()

    def observe(self, now: float, total: float) -> None:
        samples = self._samples
        if samples and now <= samples[-1][0]:
            return
        samples.append((now, float(total)))
        while len(samples) > 2 and samples[1][0] <= now - self._window_s:
            samples.popleft()

    def snapshot(self) -> list[list[float]]:
        return [list(sample) for sample in self._samples]

    def restore(self, rows: list[list[float]]) -> None:
        self._samples = deque((float(at), float(total)) for at, total in rows)

    def per_second(self) -> float | None:
        """None until two samples a second apart, or when nothing moved over the window."""
        if len(self._samples) < 2:
            return None
        (t0, s0), (t1, s1) = self._samples[0], self._samples[-1]
        if t1 - t0 < 1.0 or s1 <= s0:
            return None
        return (s1 - s0) / (t1 - t0)


@dataclass(frozen=True, slots=True)
class ObjectiveMiss:
    """A request shed by its class: the class, its objective, and the wait it was predicted (margin
    included), which its answer names and turns into Retry-After."""

    klass: str
    objective_s: float
    predicted_s: float


@dataclass
class ObjectiveRecord:
    """One class's objective and what became of its requests: met and missed, shed and downgraded, the
    prediction's errors and the margin added to it."""

    objective_s: float
    on_miss: str
    admitted: int = 0
    met: int = 0
    missed: int = 0
    shed: int = 0
    downgraded: int = 0
    margin_s: float = 0.0  # seconds added to the model before comparing with the objective
    margin_at: float = 0.0  # when the margin last moved
    admitted_at: float = 0.0  # when the class last admitted a request
    checked: int = 0  # requests whose first token came, their prediction compared
    abs_error_s: float = 0.0
    signed_error_s: float = 0.0

    def margin(self, now: float) -> float:
        """The margin now, relaxed for the time no admitted request has reported."""
        idle = now - self.margin_at
        if idle > MARGIN_RELAX_S and self.margin_s > 0:
            self.margin_s *= 0.5 ** (idle / MARGIN_RELAX_S - 1.0)
            self.margin_at = now - MARGIN_RELAX_S
        return self.margin_s

    def admit(self, now: float) -> None:
        self.admitted += 1
        self.admitted_at = now

    def outcome(self, met: bool, now: float) -> None:
        step = MARGIN_STEP * self.objective_s
        self.margin_s += -(1.0 - TARGET) * step if met else TARGET * step
        self.margin_s = min(self.objective_s, max(-self.objective_s, self.margin_s))
        self.margin_at = now

    def view(self) -> dict[str, Any]:
        n = self.checked
        return {
            "objective_s": self.objective_s,
            "on_miss": self.on_miss,
            "admitted": self.admitted,
            "met": self.met,
            "missed": self.missed,
            "shed": self.shed,
            "downgraded": self.downgraded,
            "attainment": self.met / (self.met + self.missed) if self.met + self.missed else None,
            "prediction_mean_abs_error_s": self.abs_error_s / n if n else None,
            "prediction_bias_s": self.signed_error_s / n if n else None,
            "margin_s": self.margin_s,
        }


@dataclass
class WaitPredictor:
    """The pool's rate and first-token delay, and each objective class's record."""

    rate: RateMeter = field(default_factory=RateMeter)  # service, cost units per second
    dispatch_rate: RateMeter = field(default_factory=RateMeter)  # requests dispatched per second
    dispatched: int = 0
    first_token_delay_s: float | None = None  # dispatch -> first token, recent (EWMA)
    records: dict[str, ObjectiveRecord] = field(default_factory=dict)  # class -> record

    def add_class(self, name: str, objective_s: float, on_miss: str) -> None:
        self.records[name] = ObjectiveRecord(objective_s, on_miss)

    def observe(self, now: float, service: float) -> None:
        self.rate.observe(now, service)
        self.dispatch_rate.observe(now, self.dispatched)

    def modelled(self, ahead_cost: float, starts_now: bool) -> float | None:
        """The modelled wait of a request whose leaf must see ``ahead_cost`` of the pool's service go
        before it does (``starts_now``: it would go at once); None while the pool's rates are not known
        (then nothing is enforced)."""
        delay = self.first_token_delay_s or 0.0
        if starts_now:
            return delay
        per_second, dispatches = self.rate.per_second(), self.dispatch_rate.per_second()
        if per_second is None or dispatches is None:
            return None
        return 1.0 / dispatches + ahead_cost / per_second + delay

    def admits(self, klass: str, modelled: float, now: float) -> bool:
        """Whether a request of ``klass`` modelled to wait ``modelled`` seconds is admitted: within the
        objective with the margin, or as a probe when the class admitted nothing for a while (its
        estimates come from what it admits: without probes a stale one could shed it for good)."""
        record = self.records[klass]
        return modelled + record.margin(now) <= record.objective_s or now - record.admitted_at >= PROBE_AFTER_S

    def first_token(
        self, klass: str, modelled: float | None, waited_s: float, delay_s: float | None, now: float
    ) -> None:
        """A request's first token came ``waited_s`` after it arrived, ``delay_s`` after its dispatch;
        ``modelled``: its wait as modelled when it was admitted (None: not judged)."""
        if delay_s is not None and delay_s >= 0:
            d = self.first_token_delay_s
            self.first_token_delay_s = delay_s if d is None else d + EWMA_ALPHA * (delay_s - d)
        record = self.records.get(klass)
        if record is None:
            return
        met = waited_s <= record.objective_s
        record.met += met
        record.missed += not met
        if modelled is None:
            return
        record.checked += 1
        record.abs_error_s += abs(waited_s - modelled)
        record.signed_error_s += waited_s - modelled
        if record.on_miss != "queue":
            record.outcome(met, now)

    def views(self) -> Mapping[str, dict[str, Any]]:
        return {name: r.view() for name, r in self.records.items()}

    def snapshot(self) -> dict[str, Any]:
        return {
            "rate": self.rate.snapshot(),
            "dispatch_rate": self.dispatch_rate.snapshot(),
            "dispatched": self.dispatched,
            "first_token_delay_s": self.first_token_delay_s,
            "records": {name: asdict(r) for name, r in self.records.items()},
        }

    def restore(self, data: Mapping[str, Any]) -> None:
        """From ``snapshot``, on a predictor whose classes were added (their objectives are settings)."""
        self.rate.restore(data["rate"])
        self.dispatch_rate.restore(data["dispatch_rate"])
        self.dispatched = int(data["dispatched"])
        delay = data["first_token_delay_s"]
        self.first_token_delay_s = None if delay is None else float(delay)
        names = {f.name for f in fields(ObjectiveRecord)}
        for name, row in data["records"].items():
            if name in self.records:
                self.records[name] = ObjectiveRecord(**{k: v for k, v in row.items() if k in names})
