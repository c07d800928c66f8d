"""The generated gRPC stubs of ``proto/fairgate/rpc/fairgate.proto``, shared by dispatcher and workers."""
