"""How long one continuous-batching engine step takes.

step = overhead + prefill_per_token × prompt tokens prefilled + prefill_per_seq × sequences prefilled
            + decode_per_seq × sequences decoded + decode_per_ctx_token × their context tokens

Calibrated from a profile in the format of ``a10g_llama7b_cost_profile.json``
(``{input: {output: [batch, prefill_s, decode_s]}}``, per-request seconds at the largest batch that
fits), or set directly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

H200_LLAMA3_8B_KV_TOKENS = 850_000  # 141 GB less weights (16 GB) and activations (~13 GB), at 128 KiB per token


@dataclass(frozen=True, slots=True)
class StepTimeModel:
    step_overhead_s: float
    prefill_per_token_s: float
    decode_per_seq_s: float
    decode_per_ctx_token_s: float
    prefill_per_seq_s: float = 0.0  # fixed cost of starting a sequence (noticeable on CPU engines)

    def step_time(self, prefill_tokens: int, decode_seqs: int, context_tokens: int, prefill_seqs: int = 0) -> float:
        if prefill_tokens == 0 and decode_seqs == 0:
            return 0.0
        return (
            self.step_overhead_s
            + self.prefill_per_token_s * prefill_tokens
            + self.prefill_per_seq_s * prefill_seqs
            + self.decode_per_seq_s * decode_seqs
            + self.decode_per_ctx_token_s * context_tokens
        )

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def a10g_llama7b(cls) -> StepTimeModel:
        """Fitted by ``from_profile`` to the paper's A10G / Llama-7B profile (10,000-token KV pool):
        about 900 tokens/s on 256-in / 256-out requests, like the paper's engine."""
        return cls(0.024566, 0.00021367, 0.00010250, 1.4968e-06, 0.00045179)

    @classmethod
    def h200_llama3_8b(cls) -> StepTimeModel:
        """A GPU-class engine for traces with long prompts (pair it with ``H200_LLAMA3_8B_KV_TOKENS``).
        Derived from datasheet figures, not measured: Llama-3-8B (16 GB of bf16 weights, 16 GFLOP per
        token, 128 KiB of KV per token with GQA) on an H200 (989 TFLOPS dense bf16, 4.8 TB/s), at the
        efficiencies of the A10G fit above: prefill at its ~52% of peak compute (27 us per token, 56 us
        per sequence), each step reading the weights once plus launch overhead (4.5 ms), decode per
        sequence scaled by the bandwidth ratio (8x: 13 us), per context token the KV read at half the
        bandwidth (0.055 us)."""
        return cls(0.0045, 0.000027, 0.000013, 5.5e-08, 0.000056)

    @classmethod
    def zero(cls) -> StepTimeModel:
        """Steps that take no time: for measuring the dispatcher alone."""
        return cls(0.0, 0.0, 0.0, 0.0)

    @classmethod
    def from_profile(cls, profile: dict[str, dict[str, list[float]]]) -> StepTimeModel:
        """Least-squares fit. A request (x in, y out) in a steady batch of B is charged
        prefill ≈ x·p + q and decode ≈ y·(overhead/B + per_seq + per_ctx·(x + y/2))."""
        rows = [
            (float(x), float(y), float(v[0]), float(v[1]), float(v[2]))
            for x, by_y in profile.items()
            for y, v in by_y.items()
        ]
        if not rows:
            raise ValueError("empty cost profile")
        pre_a = np.array([[x, 1.0] for x, *_ in rows])
        pre_b = np.array([r[3] for r in rows])
        prefill_per_token, prefill_per_seq = (float(c) for c in np.linalg.lstsq(pre_a, pre_b, rcond=None)[0])
        decode_rows = [r for r in rows if r[1] > 1]
        if len(decode_rows) < 3:
            raise ValueError("a cost profile needs at least 3 points with output > 1 to fit decode")
        dec_a = np.array([[y / b, y, y * (x + y / 2)] for x, y, b, _, _ in decode_rows])
        dec_b = np.array([r[4] for r in decode_rows])
        overhead, per_seq, per_ctx = (max(0.0, float(c)) for c in np.linalg.lstsq(dec_a, dec_b, rcond=None)[0])
        return cls(overhead, max(0.0, prefill_per_token), per_seq, per_ctx, max(0.0, prefill_per_seq))
