"""Output-length predictors for VTC with length prediction.

With a prediction p, VTC charges h(n_p, p) at dispatch, charges only tokens beyond p while decoding,
and refunds h(n_p, p) - h(n_p, n_q) at finish when the request ended short. Predictors only guess;
the policies ``vtc-predict`` and ``vtc-oracle`` use them, and the scheduler's ledger does the charging.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any, Protocol


class Predictor(Protocol):
    def predict(self, tenant: str, max_tokens: int, true_output: int | None) -> int: ...

    def observe(self, tenant: str, output_tokens: int) -> None: ...

    def snapshot(self) -> dict[str, Any]: ...

    def restore(self, data: dict[str, Any]) -> None: ...


class MovingAveragePredictor:
    """Per-tenant mean of the last ``window`` output lengths; a new tenant gets the global mean."""

    def __init__(self, window: int = 20) -> None:
        self.window = window
        self._history: dict[str, deque[int]] = {}
        self._sums: dict[str, int] = {}
        self._global_sum = 0
        self._global_count = 0

    def predict(self, tenant: str, max_tokens: int, true_output: int | None) -> int:
        history = self._history.get(tenant)
        if history:
            guess = self._sums[tenant] / len(history)
        elif self._global_count:
            guess = self._global_sum / self._global_count
        else:
            return 0
        return min(max_tokens, round(guess))

    def observe(self, tenant: str, output_tokens: int) -> None:
        history = self._history.setdefault(tenant, deque())
        history.append(output_tokens)
        self._sums[tenant] = self._sums.get(tenant, 0) + output_tokens
        if len(history) > self.window:
            self._sums[tenant] -= history.popleft()
        self._global_sum += output_tokens
        self._global_count += 1

    def snapshot(self) -> dict[str, Any]:
        return {
            "window": self.window,
            "history": {t: list(h) for t, h in self._history.items()},
            "global": [self._global_sum, self._global_count],
        }

    def restore(self, data: dict[str, Any]) -> None:
        self.window = int(data.get("window", self.window))
        self._history = {t: deque(int(v) for v in h) for t, h in data.get("history", {}).items()}
        self._sums = {t: sum(h) for t, h in self._history.items()}
        self._global_sum, self._global_count = (int(v) for v in data.get("global", [0, 0]))


class OraclePredictor:
    """True length × U(1 − r, 1 + r), seeded: an experiment to see what prediction quality buys."""

    def __init__(self, noise: float = 0.0, seed: int = 0) -> None:
        if not 0.0 <= noise < 1.0:
            raise ValueError("oracle noise r must be in [0, 1)")
        self.noise = noise
        self._rng = random.Random(seed)

    def predict(self, tenant: str, max_tokens: int, true_output: int | None) -> int:
        if true_output is None:
            return 0
        factor = self._rng.uniform(1.0 - self.noise, 1.0 + self.noise) if self.noise else 1.0
        return max(0, min(max_tokens, round(true_output * factor)))

    def observe(self, tenant: str, output_tokens: int) -> None:
        return None

    def snapshot(self) -> dict[str, Any]:
        version, state, gauss = self._rng.getstate()
        return {"noise": self.noise, "rng": [version, list(state), gauss]}

    def restore(self, data: dict[str, Any]) -> None:
        self.noise = float(data.get("noise", self.noise))
        if "rng" in data:
            version, state, gauss = data["rng"]
            self._rng.setstate((version, tuple(state), gauss))
