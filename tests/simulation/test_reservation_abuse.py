"""Reservation abuse in virtual time (``fairgate bench reservation``): a tenant asking for the whole
context and stopping at once holds most of the pool with full reservations; with reservations by
prediction it holds what it uses, gets all it asks for, and the honest tenant gets the rest. The
backlogged gap stays inside 2U either way."""

from __future__ import annotations

from loadgen.bench_reservation import bench_reservation

GREEDY_DEMAND = 20 * (8 + 2 * 4)  # cost units a second: 20 req/s of 8 prompt + 4 output tokens


def test_predicted_reservations_undo_the_crowding_out_and_keep_the_bound():
    full, predicted = bench_reservation(seconds=120.0)
    assert (full["reserve"], predicted["reserve"]) == ("full", "predicted")
    assert full["bound_held"] and predicted["bound_held"]
    assert predicted["throughput_tokens_per_s"] > 2 * full["throughput_tokens_per_s"]
    assert predicted["service_per_s"]["honest"] > 3 * full["service_per_s"]["honest"]
    assert predicted["service_per_s"]["greedy"] > 0.95 * GREEDY_DEMAND  # all it asks for
    assert full["share"]["greedy"] > 0.4  # before: a 16-unit request holds as much as a 768-unit one
