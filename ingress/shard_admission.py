"""Admission over dispatcher shards: an ingress replica submits to its own shard (its rank among the
replicas, modulo the shards) and follows the shard's redirects. A waiting request the shards' rounds
deal to another shard is answered with that shard's number: the caller asks there, same id and
``retry`` set, where it waits on without a lift (it waited all along). A request asked again after
its worker was lost goes to the shard that placed it (its worker is that shard's).

A shard that does not answer (its process died; Ray restarts it) is passed over: after its client's
short wait (``FAILOVER_S``) the request asks the next shard, ``retry`` set, so that it never runs twice
(what the lost shard held of it is refunded when the shard comes back: its ticket was never given)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from fairgate.common.rpc import fairgate_pb2 as pb
from fairgate.ingress.admission_client import AdmissionClient, DispatcherUnavailable

FAILOVER_S = 2.0  # how long a request waits for a shard that does not answer before it asks the next


class ShardedAdmission:
    def __init__(self, clients: Sequence[AdmissionClient], home: int, wait_s: float = 60.0) -> None:
        """``clients``: one per shard, in shard order (with several, each waiting ``FAILOVER_S`` for its
        shard); ``home``: this replica's shard; ``wait_s``: how long a request waits for some shard."""
        self._clients = list(clients)
        self.home = home % len(self._clients)
        self._wait_s = wait_s
        self.redirects = 0  # redirects followed, in all
        self.failovers = 0  # shards passed over, in all

    async def submit(self, request: pb.SubmitRequest, shard: int | None = None) -> pb.SubmitReply:
        """The request's placement or refusal, from ``shard`` (None: this replica's own), wherever it
        was dealt to, or the next shard when one does not answer."""
        shards = len(self._clients)
        at = self.home if shard is None else shard % shards
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._wait_s
        while True:
            try:
                reply = await self._clients[at].submit(request)
            except DispatcherUnavailable:
                if shards == 1 or loop.time() >= deadline:
                    raise
                self.failovers += 1
                at = (at + 1) % shards
                request.retry = True  # it may be held by the shard passed over
                continue
            if not reply.redirect:
                return reply
            self.redirects += 1
            at = int(reply.redirect) % shards
            request.retry = True

    async def close(self) -> None:
        for client in self._clients:
            await client.close()
