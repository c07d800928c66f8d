"""Assignment tickets."""

from common.tickets import TicketFields, check, sign

SECRET = b"k"


def test_valid_ticket_passes_and_every_tampering_fails():
    f = TicketFields("r1", "alice", "w0", 100.0)
    sig = sign(SECRET, f)
    assert check(SECRET, f, sig, "w0", 99.0) is None
    assert check(SECRET, f, sig, "w0", 100.5) == "ticket expired"
    assert check(SECRET, f, sig, "w1", 99.0) == "ticket is for another worker"
    assert check(b"other", f, sig, "w0", 99.0) == "bad ticket signature"
    for forged in (
        TicketFields("r2", "alice", "w0", 100.0),
        TicketFields("r1", "mallory", "w0", 100.0),
        TicketFields("r1", "alice", "w0", 1e9),
    ):
        assert check(SECRET, forged, sig, "w0", 99.0) == "bad ticket signature"


def test_field_boundaries_cannot_be_shifted():
    a = sign(SECRET, TicketFields("ab", "c", "w", 1.0))
    b = sign(SECRET, TicketFields("a", "bc", "w", 1.0))
    assert a != b
