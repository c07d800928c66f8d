"""Scheduling policies: VTC and its variants, and the baselines it is compared with.

A policy is a small description the scheduler reads: what orders waiting tenants (their counter, or
the arrival of their oldest request), whether re-joining tenants are lifted, an optional per-tenant
admission limit, and which length predictor to use. The scheduler holds the one implementation.
"""

from __future__ import annotations

from dataclasses import dataclass

from dispatcher.core.predictors import MovingAveragePredictor, NoPredictor, OraclePredictor, Predictor

POLICY_NAMES = ("vtc", "vtc-predict", "vtc-oracle", "lcf", "fcfs", "rpm:N")


@dataclass(frozen=True, slots=True)
class Policy:
    """How waiting tenants are ordered and admitted.

    ``order``: "counter" (least-served first, VTC and LCF) or "arrival" (global FIFO, FCFS and RPM).
    ``lift``: apply VTC's counter lift when a tenant re-joins the waiting set (LCF does not).
    ``rpm_limit``: admit at most this many requests per tenant in a trailing 60 s window.
    ``predictor``: "none", "moving-average" or "oracle"; ``oracle_noise`` is r in U(1-r, 1+r).
    """

    name: str
    order: str = "counter"
    lift: bool = True
    rpm_limit: int | None = None
    predictor: str = "none"
    oracle_noise: float = 0.0
    rpm_window_s: float = 60.0

    def make_predictor(self, seed: int = 0) -> Predictor:
        if self.predictor == "moving-average":
            return MovingAveragePredictor()
        if self.predictor == "oracle":
            return OraclePredictor(self.oracle_noise, seed)
        return NoPredictor()


def parse_policy(text: str) -> Policy:
    """Parse ``vtc``, ``vtc-predict``, ``vtc-oracle[:r]``, ``lcf``, ``fcfs`` or ``rpm:N``."""
    name = text.strip().lower()
    if name == "vtc":
        return Policy("vtc")
    if name == "vtc-predict":
        return Policy("vtc-predict", predictor="moving-average")
    if name == "vtc-oracle" or name.startswith("vtc-oracle:"):
        noise = _number_after_colon(name, default=0.0, what="oracle noise r")
        if not 0.0 <= noise < 1.0:
            raise ValueError(f"policy {text!r}: oracle noise r must be in [0, 1)")
        return Policy(name, predictor="oracle", oracle_noise=noise)
    if name == "lcf":
        return Policy("lcf", lift=False)
    if name == "fcfs":
        return Policy("fcfs", order="arrival", lift=False)
    if name.startswith("rpm:") or name == "rpm":
        limit = _number_after_colon(name, default=None, what="requests per minute")
        if limit is None or limit != int(limit) or limit < 1:
            raise ValueError(f"policy {text!r}: rpm needs a whole limit of at least 1, e.g. rpm:5")
        return Policy(f"rpm:{int(limit)}", order="arrival", lift=False, rpm_limit=int(limit))
    raise ValueError(f"unknown policy {text!r} (expected one of: {', '.join(POLICY_NAMES)})")


def _number_after_colon(name: str, default: float | None, what: str) -> float | None:
    if ":" not in name:
        return default
    raw = name.split(":", 1)[1]
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"policy {name!r}: {what} must be a number, got {raw!r}") from None
