"""Two dispatcher shards on loopback, each with a simulated worker on its real gRPC stream, their rounds
run live (``dispatcher/shard_rounds.py``): one tenant's requests reach one shard only, another's both;
each shard charges what its own worker serves, and after the rounds both shards' counters hold every
token each tenant was served, once, with rounds whose answers or replies were lost on the way."""

from __future__ import annotations

import asyncio

from fairgate.core import SchedulerConfig
from fairgate.dispatcher.service import DispatcherService, Redirected
from fairgate.dispatcher.shard_rounds import FleetRounds, LocalShard
from fairgate.workers.engines.simulated import SimulatedEngine
from fairgate.workers.engines.simulated.runner import SimulatedRunner
from fairgate.workers.worker import Worker

from ..waiting import eventually
from .test_grpc_services import FAST, SECRET, generate


class FlakyShard(LocalShard):
    """A shard whose answers to the next ``lose`` rounds are lost on the way (after it gave them), and
    the fleet's replies to it in the ``drop`` rounds after (before it took them)."""

    lose = drop = 0

    async def batches(self):
        answer = await super().batches()
        if self.lose:
            self.lose -= 1
            raise ConnectionError("the answer was lost")
        return answer

    async def adopt(self, last, waiting_elsewhere):
        if self.drop:
            self.drop -= 1
            raise ConnectionError("the reply was lost")
        await super().adopt(last, waiting_elsewhere)


def test_two_live_shards_charge_their_own_workers_and_agree_on_every_tenant_s_counters():
    async def scenario():
        services, workers = [], []
        for k in range(2):
            service = DispatcherService(SchedulerConfig(), SECRET)
            for tenant in ("A", "B"):  # every shard knows the tenants (the gateway's registry names them)
                service.scheduler.add_tenant(tenant)
            address = await service.start()
            worker = Worker(f"w{k}", address, SECRET, SimulatedRunner(SimulatedEngine(4000, FAST)))
            await worker.start()
            services.append(service)
            workers.append(worker)
        for service in services:
            await eventually(lambda service=service: len(service.scheduler.workers) == 1)
        shards = [LocalShard("0", services[0]), FlakyShard("1", services[1])]
        rounds = FleetRounds(shards, tau_s=0.02, timeout_s=1.0)
        stop = asyncio.Event()
        running = asyncio.create_task(rounds.run(stop))
        served = {"A": 0.0, "B": 0.0}
        cost = services[0].scheduler.ledger.cost_between

        async def one(k: int, rid: str, tenant: str, tokens: int) -> None:
            placed = await services[k].submit(rid, tenant, 10, tokens)
            chunks = await generate(placed, "hi " * 10, tokens)
            assert chunks[-1].completion_tokens == tokens
            served[tenant] += cost(None, (10, tokens))

        jobs = [one(0, f"a{i}", "A", 5 + i) for i in range(8)]  # A reaches shard 0 only
        jobs += [one(i % 2, f"b{i}", "B", 3 + i) for i in range(8)]  # B both
        shards[1].lose, shards[1].drop = 3, 3
        await asyncio.gather(*jobs)
        await eventually(lambda: all(not s.scheduler.in_flight() for s in services))
        await eventually(lambda: shards[1].lose == shards[1].drop == 0)
        done = rounds.rounds
        await eventually(lambda: rounds.rounds >= done + 2)  # rounds after the last charge went through
        stop.set()
        await running
        assert rounds.left_out >= 3
        for service in services:
            for tenant, total in served.items():
                assert abs(service.scheduler.tenants[tenant].service - total) < 1e-6, (tenant, service.id)
        assert services[1].scheduler.tenants["A"].service > 0  # learned from the other shard only
        for w in workers:
            await w.stop()
        for s in services:
            await s.stop()

    asyncio.run(scenario())


def test_a_tenant_reaching_one_shard_is_dealt_to_the_other_and_served_by_both_workers():
    """Every request of A reaches shard 0, whose worker runs few at once; the rounds deal A's waiting
    requests to shard 1 (their callers are told to ask there), so both workers serve A; each request
    runs once, whole, and both shards agree on A's service."""

    async def scenario():
        services, workers = {}, []
        for k in range(2):
            service = DispatcherService(SchedulerConfig(max_engine_waiting=0), SECRET)
            service.scheduler.add_tenant("A")
            address = await service.start()
            worker = Worker(f"w{k}", address, SECRET, SimulatedRunner(SimulatedEngine(400, FAST)))
            await worker.start()
            services[str(k)] = service
            workers.append(worker)
        for service in services.values():
            await eventually(lambda service=service: len(service.scheduler.workers) == 1)
        rounds = FleetRounds([LocalShard(name, s) for name, s in services.items()], tau_s=0.02)
        stop = asyncio.Event()
        running = asyncio.create_task(rounds.run(stop))
        cost = services["0"].scheduler.ledger.cost_between
        served = 0.0

        async def one(rid: str) -> None:
            nonlocal served
            shard, retry = "0", False
            while True:
                try:
                    placed = await services[shard].submit(rid, "A", 10, 30, retry=retry)
                    break
                except Redirected as redirected:  # dealt to the other shard: ask it, same id
                    shard, retry = redirected.shard, True
            chunks = await generate(placed, "hi " * 10, 30)
            assert chunks[-1].completion_tokens == 30
            served += cost(None, (10, 30))

        await asyncio.gather(*(one(f"a{i}") for i in range(24)))
        await eventually(lambda: all(not s.scheduler.in_flight() for s in services.values()))
        done = rounds.rounds
        await eventually(lambda: rounds.rounds >= done + 2)
        stop.set()
        await running
        assert rounds.dealt > 0
        ran = [{rid for rid in w.generated if rid.startswith("a")} for w in workers]
        assert ran[0] and ran[1] and not ran[0] & ran[1]  # both served A; none ran on both
        assert all(n == 1 for w in workers for n in w.generated.values())
        for service in services.values():
            assert abs(service.scheduler.tenants["A"].service - served) < 1e-6
        for w in workers:
            await w.stop()
        for s in services.values():
            await s.stop()

    asyncio.run(scenario())


def test_a_restarted_rounds_runner_goes_on_from_the_figures_the_shards_last_adopted():
    async def scenario():
        services = [DispatcherService(SchedulerConfig(), SECRET) for _ in range(2)]
        for service in services:
            service.scheduler.add_tenant("A")
        shards = [LocalShard(str(k), s) for k, s in enumerate(services)]
        first = FleetRounds(shards)
        services[0].scheduler.adopt_figures({"t/A": (100.0, 100.0, 0.0)}, ())  # shard 0 served A 100
        await first.round()
        assert [s.scheduler.tenants["A"].service for s in services] == [100.0, 100.0]
        restarted = FleetRounds(shards)  # the runner's process was lost: it knows nothing
        services[1].scheduler.adopt_figures({"t/A": (130.0, 130.0, 0.0)}, ())  # shard 1 served A 30 more
        await restarted.round()
        assert [s.scheduler.tenants["A"].service for s in services] == [130.0, 130.0]
        assert restarted.number == first.number + 1

    asyncio.run(scenario())


def test_an_ingress_passes_over_a_shard_that_does_not_answer_and_follows_redirects():
    """Shard 0's admission endpoint is gone and its actor does not answer (restarting): after the short
    wait a request asks shard 1, ``retry`` set; a redirect from shard 1 to shard 0 is followed when
    shard 0 answers again."""
    from fairgate.common.rpc import fairgate_pb2 as pb
    from fairgate.dispatcher.admission_service import AdmissionServer
    from fairgate.ingress.admission_client import AdmissionClient
    from fairgate.ingress.shard_admission import ShardedAdmission

    async def scenario():
        seen: list[tuple[int, str, bool]] = []

        def admit(shard: int, redirect: str = ""):
            async def answer(request: pb.SubmitRequest) -> pb.SubmitReply:
                seen.append((shard, request.request_id, request.retry))
                if redirect and request.request_id == "dealt":
                    return pb.SubmitReply(redirect=redirect)
                return pb.SubmitReply(shard=shard, worker_id=f"w{shard}")

            return answer

        one = AdmissionServer(admit(1, redirect="0"), SECRET, 1 << 20)
        addresses = {1: await one.start("127.0.0.1")}
        restarting = asyncio.Event()  # shard 0's actor: its address waits for it

        async def where(shard: int) -> str:
            if shard == 0:
                await restarting.wait()
            return addresses[shard]

        clients = [
            AdmissionClient(lambda k=k: where(k), SECRET.decode(), wait_s=0.3, abandoned=lambda r: None)
            for k in range(2)
        ]
        admission = ShardedAdmission(clients, home=0, wait_s=10.0)
        reply = await admission.submit(pb.SubmitRequest(request_id="r1", tenant="A"))
        assert (reply.shard, admission.failovers) == (1, 1)
        assert seen == [(1, "r1", True)]  # asked again: the shard passed over may hold it
        zero = AdmissionServer(admit(0), SECRET, 1 << 20)
        addresses[0] = await zero.start("127.0.0.1")
        restarting.set()
        dealt = ShardedAdmission(clients, home=1)
        reply = await dealt.submit(pb.SubmitRequest(request_id="dealt", tenant="A"))
        assert reply.shard == 0 and seen[-2:] == [(1, "dealt", False), (0, "dealt", True)]
        assert dealt.redirects == 1
        for client in clients:
            await client.close()
        await one.stop()
        await zero.stop()

    asyncio.run(scenario())
