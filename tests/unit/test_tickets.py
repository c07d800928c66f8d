"""Assignment tickets and worker credentials."""

from fairgate.common.tickets import (
    NonceBook,
    TicketBook,
    TicketFields,
    check,
    check_size,
    check_worker_token,
    sign,
    worker_token,
)

SECRET = b"k"


def test_valid_ticket_passes_and_every_tampering_fails():
    f = TicketFields("r1", "alice", "w0", 100.0, 10, 20)
    sig = sign(SECRET, f)
    assert check(SECRET, f, sig, "w0", 99.0) is None
    assert check(SECRET, f, sig, "w0", 100.5) == "ticket expired"
    assert check(SECRET, f, sig, "w1", 99.0) == "ticket is for another worker"
    assert check(b"other", f, sig, "w0", 99.0) == "bad ticket signature"
    for forged in (
        TicketFields("r2", "alice", "w0", 100.0, 10, 20),
        TicketFields("r1", "mallory", "w0", 100.0, 10, 20),
        TicketFields("r1", "alice", "w0", 1e9, 10, 20),
        TicketFields("r1", "alice", "w0", 100.0, 10, 2000),  # a bigger request than was admitted
        TicketFields("r1", "alice", "w0", 100.0, 1000, 20),
    ):
        assert check(SECRET, forged, sig, "w0", 99.0) == "bad ticket signature"


def test_field_boundaries_cannot_be_shifted():
    a = sign(SECRET, TicketFields("ab", "c", "w", 1.0))
    b = sign(SECRET, TicketFields("a", "bc", "w", 1.0))
    assert a != b


def test_a_ticket_covers_no_more_than_the_admitted_size():
    f = TicketFields("r1", "alice", "w0", 100.0, 10, 20)
    assert check_size(f, 10, 20) is None and check_size(f, 3, 1) is None
    assert "max_tokens 21" in (check_size(f, 10, 21) or "")
    assert "11 tokens" in (check_size(f, 11, 20) or "")


def test_a_ticket_is_taken_once_and_the_book_forgets_expired_ones():
    book = TicketBook()
    assert book.take(b"sig-1", 10.0, 0.0)
    assert not book.take(b"sig-1", 10.0, 1.0)  # replayed
    for i in range(2000):  # many more, long after the first expired: the book stays small
        assert book.take(f"sig-{i + 2}".encode(), 100.0 + i, 50.0 + i)
    assert len(book) == 51  # exactly the live ones: expiring at 2049 or later
    assert not book.take(b"sig-2001", 2099.0, 2049.0)  # a live one is still refused


def test_worker_credentials_are_bound_to_the_worker_and_its_address_expire_and_are_taken_once():
    token = worker_token(SECRET, "w1", "10.0.0.5:7000", 1000.0)
    assert check_worker_token(SECRET, "w1", "10.0.0.5:7000", token, 1010.0) is None
    assert check_worker_token(SECRET, "w2", "10.0.0.5:7000", token, 1010.0) == "bad worker credentials"
    assert check_worker_token(SECRET, "w1", "10.0.0.6:7000", token, 1010.0) == "bad worker credentials"
    assert check_worker_token(b"other", "w1", "10.0.0.5:7000", token, 1010.0) == "bad worker credentials"
    assert check_worker_token(SECRET, "w1", "10.0.0.5:7000", token, 1100.0) == "worker credentials too old"
    assert check_worker_token(SECRET, "w1", "10.0.0.5:7000", "", 1000.0) == "bad worker credentials"
    nonces = NonceBook()
    assert check_worker_token(SECRET, "w1", "10.0.0.5:7000", token, 1010.0, nonces) is None
    assert check_worker_token(SECRET, "w1", "10.0.0.5:7000", token, 1011.0, nonces) == "worker credentials already used"
    fresh = worker_token(SECRET, "w1", "10.0.0.5:7000", 1012.0)
    assert check_worker_token(SECRET, "w1", "10.0.0.5:7000", fresh, 1012.0, nonces) is None  # a new connection
