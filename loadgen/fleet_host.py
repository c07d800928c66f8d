"""Many workers in one process, for ``fairgate bench scale``: the real worker code (``Worker``: its gRPC
report stream to the dispatcher and its data plane) over simulated engines of modelled step time, so
that a fleet of a thousand fits on one machine. Each worker is what a worker replica runs, less Ray
Serve around it.

Run as ``python -m fairgate.loadgen.fleet_host SPEC`` (SPEC: the JSON of ``FleetSpec``); it prints
``ready`` once every worker has started, and stops its workers when its standard input closes.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import asdict, dataclass

from fairgate.workers.engines.simulated import SimulatedEngine, StepTimeModel
from fairgate.workers.engines.simulated.runner import SimulatedRunner
from fairgate.workers.engines.simulated.settings import STEP_PRESETS
from fairgate.workers.worker import Worker


@dataclass(frozen=True)
class FleetSpec:
    dispatcher: str  # the pool's Dispatcher gRPC address
    secret: str  # the cluster secret
    first: int  # this host's workers are w{first} .. w{first + count - 1}
    count: int
    kv_tokens: int
    max_running: int
    step_model: str  # a preset of ``STEP_PRESETS``

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def engine(spec: FleetSpec) -> SimulatedEngine:
    model: StepTimeModel = STEP_PRESETS[spec.step_model]()
    return SimulatedEngine(spec.kv_tokens, model, max_running=spec.max_running)


async def host(spec: FleetSpec) -> None:
    secret = spec.secret.encode()  # as the dispatcher's services take it
    workers = [
        Worker(f"w{spec.first + i}", spec.dispatcher, secret, SimulatedRunner(engine(spec))) for i in range(spec.count)
    ]
    for w in workers:
        await w.start()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the bench closes it
    for w in workers:
        await w.stop()


if __name__ == "__main__":
    asyncio.run(host(FleetSpec(**json.loads(sys.argv[1]))))
