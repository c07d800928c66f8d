"""VTC with an oracle's output length (an experiment: what perfect, or noisy, prediction buys)."""

from __future__ import annotations

from fairgate.core.policies.base import register
from fairgate.core.policies.vtc_predict import VtcPredict
from fairgate.core.predictors import OraclePredictor
from fairgate.core.registry import Param


@register
class VtcOracle(VtcPredict):
    """VTC with length prediction where the prediction is the true output length (known in
    simulations) times U(1 - r, 1 + r), seeded; ``vtc-oracle:r``, r in [0, 1), 0 by default.

    Guarantee: as ``vtc-predict`` (3U). Trade-off: needs the true length, so it exists only in
    experiments; a gateway has no oracle (requests carry no ``true_output``: nothing is charged ahead).
    """

    name = "vtc-oracle"
    params = (Param("noise", float, 0.0, "r: the prediction is the true length times U(1 - r, 1 + r), r in [0, 1)"),)
    examples = ("vtc-oracle", "vtc-oracle:0.5")

    def __init__(self, seed: int = 0, noise: float = 0.0) -> None:
        super().__init__(seed)
        if not 0.0 <= noise < 1.0:
            raise ValueError(f"policy 'vtc-oracle:{noise}': oracle noise r must be in [0, 1)")
        self.noise = noise
        self.predictor = OraclePredictor(noise, seed)
