"""Admission over dispatcher shards: an ingress replica submits to its own shard (its rank among the
replicas, modulo the shards) and follows the shard's redirects. A waiting request the shards' rounds
deal to another shard is answered with that shard's number: the caller asks there, same id and
``retry`` set, where it waits on without a lift (it waited all along). A request asked again after
its worker was lost goes to the shard that placed it (its worker is that shard's)."""

from __future__ import annotations

from collections.abc import Sequence

from fairgate.common.rpc import fairgate_pb2 as pb
from fairgate.ingress.admission_client import AdmissionClient


class ShardedAdmission:
    def __init__(self, clients: Sequence[AdmissionClient], home: int) -> None:
        """``clients``: one per shard, in shard order; ``home``: this replica's shard."""
        self._clients = list(clients)
        self.home = home % len(self._clients)
        self.redirects = 0  # redirects followed, in all

    async def submit(self, request: pb.SubmitRequest, shard: int | None = None) -> pb.SubmitReply:
        """The request's placement or refusal, from ``shard`` (None: this replica's own) or wherever it
        was dealt to."""
        at = self.home if shard is None else shard % len(self._clients)
        while True:
            reply = await self._clients[at].submit(request)
            if not reply.redirect:
                return reply
            self.redirects += 1
            at = int(reply.redirect) % len(self._clients)
            request.retry = True

    async def close(self) -> None:
        for client in self._clients:
            await client.close()
