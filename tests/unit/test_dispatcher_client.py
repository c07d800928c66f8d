"""The ingress's calls to a sharded dispatcher: a tenant, node or adapter change goes to shard 0 first
and, accepted there, to every other shard; a refused one goes no further; reads ask shard 0."""

from __future__ import annotations

import asyncio

from fairgate.ingress.dispatcher_client import DispatcherClient


class Method:
    def __init__(self, shard: FakeShard, name: str) -> None:
        self.shard, self.name = shard, name

    def remote(self, *args):
        self.shard.calls.append((self.name, args))

        async def answer():
            return self.shard.answer

        return answer()


class FakeShard:
    def __init__(self, answer) -> None:
        self.answer = answer
        self.calls: list = []

    def __getattr__(self, name: str) -> Method:
        return Method(self, name)


def test_a_change_reaches_every_shard_once_shard_0_took_it():
    shards = [FakeShard({"name": "t"}), FakeShard({"name": "t"}), FakeShard({"error": [503, "no store"]})]
    client = DispatcherClient(shards, wait_s=1.0)
    result = asyncio.run(client.change_tenant("create", "t", "h", 1.0, None, None, None))
    assert result == {"name": "t"}  # shard 0's answer, whatever another shard said
    assert [s.calls for s in shards] == [[("change_tenant", ("create", "t", "h", 1.0, None, None, None))]] * 3
    asyncio.run(client.telemetry())
    assert [len(s.calls) for s in shards] == [2, 1, 1]  # reads: shard 0's


def test_a_change_shard_0_refused_goes_no_further():
    shards = [FakeShard({"error": [409, "exists"]}), FakeShard({"name": "n"})]
    client = DispatcherClient(shards, wait_s=1.0)
    assert asyncio.run(client.change_node("create", "n", None, 1.0)) == {"error": [409, "exists"]}
    assert shards[1].calls == []
