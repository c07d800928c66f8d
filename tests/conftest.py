"""Shared test settings: where the data lies (in the repository), and hypothesis profiles."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from fairgate.common.loopback import ray_environment

ray_environment()  # before anything imports Ray: every Ray listener on 127.0.0.1, no usage stats
# Ray clusters that tests start in their own processes (`serve run`, `fairgate serve`, several nodes)
# start beside the other test worker: a raylet may take longer than Ray's 30 s to register
os.environ.setdefault("RAY_raylet_start_wait_time_s", "120")
# Ray's own background work that no test reads (its metrics and task events, idle worker processes kept
# ready): about a twentieth of a core per idle cluster here, over the two test workers' whole run
for _key, _value in {
    "RAY_enable_worker_prestart": "0",
    "RAY_prestart_worker_first_driver": "0",
    "RAY_metrics_report_interval_ms": "60000",
    "RAY_task_events_report_interval_ms": "10000",
}.items():
    os.environ.setdefault(_key, _value)

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from fairgate.loadgen.datasets import ARENA_TRACE, MOONCAKE_TRACE  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

settings.register_profile("default", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# the light path (`bash scripts/test.sh tests/unit`): every property checked, on fewer random cases
settings.register_profile("quick", max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("FAIRGATE_HYPOTHESIS") or ("ci" if os.environ.get("CI") else "default"))


# The test command runs the suite on two workers (pytest-xdist, ``--dist loadscope
# --no-loadscope-reorder``: a module's tests stay together on one worker, sharing its module-scoped
# servers, and modules are handed out in collection order). The longest go first, a long one handed
# out last would leave the other worker idle: these, roughly longest first, as profiled runs of the
# suite measured them. The soak first: two and a half minutes of waiting on half a core, beside the
# vLLM module, whose engines start in parallel and take the other core and a half (beside the
# conformance suite, which takes one core, half a core sat idle).
LONGEST_FIRST = (
    "tests/e2e/test_soak.py",
    "tests/e2e/test_vllm.py",
    "tests/unit/test_policy_conformance.py",
    "tests/e2e/test_serve_cli.py",
    "tests/e2e/test_bench_peers.py",
    "tests/e2e/test_vllm_cache.py",
    "tests/e2e/test_deploy_serve_yaml.py",
    "tests/e2e/test_node_loss.py",
    "tests/e2e/test_tree.py",
    "tests/e2e/test_fairness.py",
    "tests/e2e/test_chaos.py",
    "tests/simulation/test_paper_results.py",
    "tests/integration/test_vllm_engine.py",
    "tests/e2e/test_abuse.py",
    "tests/integration/test_cli.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    where = {id(item): item.path.relative_to(REPO).as_posix() for item in items}
    items.sort(key=lambda item: rank.get(where[id(item)], len(rank)))  # stable: the rest keep their order


@pytest.fixture(scope="session")
def arena_trace() -> Path:
    return ARENA_TRACE


@pytest.fixture(scope="session")
def mooncake_trace() -> Path:
    return MOONCAKE_TRACE


# Ports handed to servers that bind them later, often seconds later and in another process: from
# below the kernel's ephemeral range (a port bind(0) returned, once closed, can be given to the other
# test worker's next server first, which then answers in its place) and above Ray's worker ports, a
# slice of its own for each test worker, never the same one twice in a process.
PORT_RANGE = range(21000, 32000)


def _port_slice() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) if worker.isdigit() else 0
    size = len(PORT_RANGE) // 4
    return range(PORT_RANGE.start + (index % 4) * size, PORT_RANGE.start + (index % 4 + 1) * size)


_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback port free now that no other caller in this run is handed."""
    for port in _port_slice():
        if port in _handed_out:
            continue
        _handed_out.add(port)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("every port of this test worker's slice was handed out")


@pytest.fixture(scope="session")
def serve_port():
    """One local Ray cluster and Serve instance for the whole session (starting them costs ~10 s)."""
    import ray
    from ray import serve

    from fairgate.gateway.app import start_local_ray

    start_local_ray(num_cpus=2)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    yield port
    # the cluster goes with every replica in it: Serve's own shutdown would first wait for the replicas
    # of the last gateways to drain (half a minute at the end of each test worker)
    ray.shutdown()


class RedisServer:
    """A real redis-server on a free loopback port, that a test may kill and start again. ``persist``:
    an append-only file in its folder, so that a restart finds what it held (as on Kubernetes)."""

    def __init__(self, workdir: Path, persist: bool = False, start: bool = True) -> None:
        import shutil

        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed: run the tests with `bash scripts/test.sh` (it installs it)")
        self.port = free_port()
        self.args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--dir", str(workdir)]
        self.args += ["--appendonly", "yes", "--appendfsync", "always"] if persist else ["--appendonly", "no"]
        self.proc = None
        if start:
            self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import subprocess
        import time

        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                pytest.fail(f"redis-server did not start on 127.0.0.1:{self.port}")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: no goodbye, as a crashed pod."""
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    """A real Redis server for the session, on a free loopback port, persisting nothing to disk.
    ``scripts/test.sh`` installs Debian's redis-server when it is missing."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server.url
    server.stop()
