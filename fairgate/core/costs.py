"""Cost functions h(n_p, n_q): how much service a request of n_p prompt and n_q output tokens is.

VTC charges a request incrementally: h(n_p, 0) at dispatch, then h(n_p, k) - h(n_p, k-1) for the k-th
output token. Every cost function here is a plain total; the increments are derived from it so there
is only one definition of a request's cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class CostFunction(Protocol):
    """Service, in cost units, of a request with ``n_p`` prompt and ``n_q`` output tokens, of which
    ``n_c`` prompt tokens were found in the engine's prefix cache: ``total(n_p, n_q) -
    cached_discount(n_c)`` (docs/architecture.md). The discount is linear in ``n_c`` and never more than the
    prompt's own charge, so every charge stays non-negative."""

    def total(self, n_p: int, n_q: int) -> float: ...

    def cached_discount(self, n_c: int) -> float: ...

    def spec(self) -> dict[str, Any]: ...


DEFAULT_CACHED_FRACTION = 0.1  # a cached prompt token costs a tenth of a computed one (its KV is read, not built)


@dataclass(frozen=True, slots=True)
class LinearCost:
    """W = w_c * n_cached + w_p * n_uncached + w_q * n_q: the paper's default (w_p = 1, w_q = 2), with
    cached prompt tokens at w_c (default a tenth of w_p; w_c = w_p charges the cache blind)."""

    w_p: float = 1.0
    w_q: float = 2.0
    w_c: float | None = None  # None: DEFAULT_CACHED_FRACTION * w_p

    def __post_init__(self) -> None:
        object.__setattr__(self, "w_c", self.cached_weight)
        if not 0 <= self.cached_weight <= self.w_p:
            raise ValueError(f"linear cost: w_c must be between 0 and w_p ({self.w_p:g}), got {self.cached_weight:g}")

    @property
    def cached_weight(self) -> float:
        """``w_c``, its default resolved."""
        return DEFAULT_CACHED_FRACTION * self.w_p if self.w_c is None else self.w_c

    def total(self, n_p: int, n_q: int) -> float:
        return self.w_p * n_p + self.w_q * n_q

    def cached_discount(self, n_c: int) -> float:
        return (self.w_p - self.cached_weight) * n_c

    def spec(self) -> dict[str, Any]:
        return {"kind": "linear", "w_p": self.w_p, "w_q": self.w_q, "w_c": self.w_c}


# The paper's fit of h to the A10G / Llama-7B profile (its data: loadgen/data/README.md): milliseconds of engine time.
PAPER_PROFILE_COEFFS = (0.21001891, 0.10075395, 0.0039868, 0.00324733, 1.14601454)


@dataclass(frozen=True, slots=True)
class ProfiledCost:
    """h(x, y) = a x + b y + c x y + d y² + e, x = prompt, y = output tokens.

    The quadratic terms charge long generations more per token, as attention over a growing context
    costs more; the constant charges each request's fixed overhead at dispatch. A cached prompt token
    costs ``cached_fraction`` of the prompt's per-token charge ``a`` (its prefill is skipped; the
    attention over it during decode, the c x y term, is not).

    Every charge must be non-negative, or a tenant's counter could go down as it is served (and the
    waiting set, which re-keys growing keys lazily, would lose its order): the dispatch charge
    h(x, 0) = a x + e and each output token's h(x, k) - h(x, k-1) = b + c x + d (2k - 1), for every
    x >= 0 and k >= 1. That holds exactly when a, c, d, e >= 0 and b + d >= 0; anything else is refused.
    """

    def __post_init__(self) -> None:
        coeffs = {"a": self.a, "b": self.b, "c": self.c, "d": self.d, "e": self.e}
        if any(v != v or v in (float("inf"), float("-inf")) for v in coeffs.values()):
            raise ValueError(f"profiled cost: coefficients must be finite numbers, got {coeffs}")
        negative = [name for name in ("a", "c", "d", "e") if coeffs[name] < 0]
        if negative or self.b + self.d < 0:
            what = ", ".join(f"{n} = {coeffs[n]:g}" for n in negative) or f"b + d = {self.b + self.d:g}"
            raise ValueError(
                f"profiled cost: a charge could be negative ({what}); h needs a, c, d, e >= 0 and b + d >= 0"
            )
        if not 0 <= self.cached_fraction <= 1:
            raise ValueError(f"profiled cost: cached_fraction must be between 0 and 1, got {self.cached_fraction:g}")

    a: float = PAPER_PROFILE_COEFFS[0]
    b: float = PAPER_PROFILE_COEFFS[1]
    c: float = PAPER_PROFILE_COEFFS[2]
    d: float = PAPER_PROFILE_COEFFS[3]
    e: float = PAPER_PROFILE_COEFFS[4]
    cached_fraction: float = DEFAULT_CACHED_FRACTION

    def total(self, n_p: int, n_q: int) -> float:
        return self.a * n_p + self.b * n_q + self.c * n_p * n_q + self.d * n_q * n_q + self.e

    def cached_discount(self, n_c: int) -> float:
        return (1.0 - self.cached_fraction) * self.a * n_c

    def spec(self) -> dict[str, Any]:
        coeffs = [self.a, self.b, self.c, self.d, self.e]
        return {"kind": "profiled", "coeffs": coeffs, "cached_fraction": self.cached_fraction}


def cost_from_spec(spec: dict[str, Any] | None) -> CostFunction:
    """Rebuild a cost function from ``spec()`` output (used by snapshots and configuration)."""
    if not spec or spec.get("kind", "linear") == "linear":
        spec = spec or {}
        w_c = spec.get("w_c")
        return LinearCost(float(spec.get("w_p", 1.0)), float(spec.get("w_q", 2.0)), None if w_c is None else float(w_c))
    if spec["kind"] == "profiled":
        coeffs = spec.get("coeffs") or PAPER_PROFILE_COEFFS
        if len(coeffs) != 5:
            raise ValueError("profiled cost needs 5 coefficients (a, b, c, d, e)")
        a, b, c, d, e = (float(x) for x in coeffs)
        return ProfiledCost(a, b, c, d, e, float(spec.get("cached_fraction", DEFAULT_CACHED_FRACTION)))
    raise ValueError(f"unknown cost function kind {spec['kind']!r} (expected 'linear' or 'profiled')")


def fit_profiled_cost(profile: dict[str, dict[str, list[float]]]) -> ProfiledCost:
    """Least-squares fit of h to a profile ``{input: {output: [batch, prefill_s, decode_s]}}``, under
    the constraints that make every charge non-negative (``ProfiledCost``).

    The target is the per-request engine time in milliseconds (prefill_s + decode_s), as in the paper.
    With b' = b + d, h = a x + b' y + c x y + d (y² - y) + e, and the constraints are all five
    coefficients >= 0: the best fit among every choice of coefficients held at zero (32 small
    systems) is exact non-negative least squares. A measured profile whose free fit would charge
    negatively (e.g. decode getting cheaper per token with length, seen on CPUs) gets the closest
    valid h instead. Pure arithmetic (normal equations) so the core stays free of numpy.
    """
    rows: list[tuple[list[float], float]] = []
    for x_key, by_output in profile.items():
        for y_key, values in by_output.items():
            x, y = float(x_key), float(y_key)
            rows.append(([x, y, x * y, y * y - y, 1.0], 1000.0 * (values[1] + values[2])))
    if len(rows) < 5:
        raise ValueError("a cost profile needs at least 5 (input, output) points to fit h")
    best: tuple[float, list[float]] | None = None
    for mask in range(1, 32):
        free = [i for i in range(5) if mask >> i & 1]
        ata = [[sum(f[i] * f[j] for f, _ in rows) for j in free] for i in free]
        atb = [sum(f[i] * t for f, t in rows) for i in free]
        try:
            solved = _solve(ata, atb)
        except ValueError:
            continue
        if any(v < 0 for v in solved):
            continue
        coeffs = [0.0] * 5
        for i, v in zip(free, solved, strict=True):
            coeffs[i] = v
        residual = sum((sum(c * v for c, v in zip(coeffs, f, strict=True)) - t) ** 2 for f, t in rows)
        if best is None or residual < best[0]:
            best = (residual, coeffs)
    if best is None:
        raise ValueError("cost profile is degenerate: cannot fit h")
    a, b_plus_d, c, d, e = best[1]
    return ProfiledCost(a, b_plus_d - d, c, d, e)


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting for a small dense system."""
    n = len(b)
    m = [[*row, b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-300:
            raise ValueError("cost profile is degenerate: cannot fit h")
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                factor = m[r][col] / m[col][col]
                for k in range(col, n + 1):
                    m[r][k] -= factor * m[col][k]
    return [m[i][n] / m[i][i] for i in range(n)]
