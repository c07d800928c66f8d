"""The generated gRPC stubs of ``proto/common/rpc/fairgate.proto``: the wire contracts every process
shares (never edited by hand; ``python -m fairgate.common.rpc.generate`` writes them)."""
