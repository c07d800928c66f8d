"""``max_tokens`` abuse in virtual time (``fairgate bench reservation``): a tenant asking for the whole
context and stopping at once holds nothing beyond what it uses, since admission follows the engine's
own rule and reserves no output. It gets all it asks for, the honest tenant gets the rest, the pool
stays as busy as the engine alone keeps it, and the backlogged gap stays inside the bound."""

from __future__ import annotations

from fairgate.loadgen.benches.reservation import bench_reservation

GREEDY_DEMAND = 20 * (8 + 2 * 4)  # cost units a second: 20 req/s of 8 prompt + 4 output tokens


def test_a_greedy_max_tokens_holds_nothing_beyond_use_and_the_bound_holds():
    fairgate, alone = bench_reservation(seconds=120.0)
    assert (fairgate["front"], alone["front"]) == ("fairgate", "round-robin")
    assert fairgate["bound_held"]
    assert fairgate["throughput_tokens_per_s"] >= 0.95 * alone["throughput_tokens_per_s"]
    assert fairgate["service_per_s"]["greedy"] > 0.95 * GREEDY_DEMAND  # all it asks for
    assert fairgate["service_per_s"]["honest"] > 0.95 * alone["service_per_s"]["honest"]  # and the rest
