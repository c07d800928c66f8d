"""The committed gRPC stubs are exactly what ``proto/`` generates (never edited by hand)."""

from fairgate.common.rpc.generate import stale_files


def test_stubs_match_the_proto_files():
    assert stale_files() == [], "run `python -m fairgate.common.rpc.generate` and commit the result"
