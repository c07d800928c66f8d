"""The worker deployment's Ray Serve autoscaling policy, driven by the dispatcher's demand.

Serve instantiates the class once in its controller (``policy_kwargs`` are its arguments) and calls it
every control-loop tick; Serve itself then applies ``min_replicas``/``max_replicas`` and the up and down
delays that keep it from flapping. A background thread polls the dispatcher actor, so a tick never
waits on it; with no fresh reading the policy keeps the current target.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any

from fairgate.core import Demand, ReplicaCapacity, desired_replicas
from fairgate.core.capacity import fleet_demand

log = logging.getLogger(__name__)

POLICY_PATH = "fairgate.workers.autoscaling:DispatcherDemandPolicy"
STALE_AFTER_S = 10.0


class DispatcherDemandPolicy:
    def __init__(
        self,
        app: str,
        kv_tokens_per_replica: int,
        max_running_per_replica: int | None = None,
        target_utilization: float = 0.8,
        poll_interval_s: float = 0.5,
        model: str | None = None,
        shards: int = 1,
    ) -> None:
        """``shards``: the dispatcher's shards, each holding the demand of its slice of the pool."""
        self._app = app
        self._model = model
        self._shards = shards
        self._capacity = ReplicaCapacity(kv_tokens_per_replica, max_running_per_replica, target_utilization)
        self._poll_interval_s = poll_interval_s
        self._latest: list[tuple[float, Demand]] = []  # the newest reading, written by the poller
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        self._ensure_polling()
        latest = self._latest[-1] if self._latest else None
        if latest is None or time.monotonic() - latest[0] > STALE_AFTER_S:
            return ctx.target_num_replicas, {}
        demand = latest[1]
        desired = desired_replicas(demand, self._capacity)
        bounded = max(ctx.capacity_adjusted_min_replicas, min(ctx.capacity_adjusted_max_replicas, desired))
        return bounded, {"fairgate_desired": desired, "fairgate_queued": demand.queued_requests}

    def _ensure_polling(self) -> None:
        if self._thread is None:
            args = (self._app, self._model, self._shards, self._poll_interval_s, self._stop, self._latest)
            self._thread = threading.Thread(target=_poll, args=args, name="fairgate-demand-poll", daemon=True)
            self._thread.start()
            weakref.finalize(self, self._stop.set)  # stops when Serve replaces the policy


def _poll(
    app: str,
    model: str | None,
    shards: int,
    interval_s: float,
    stop: threading.Event,
    latest: list[tuple[float, Demand]],
) -> None:
    import ray

    from fairgate.dispatcher.names import dispatcher_name

    actors: list[Any] = []
    while not stop.is_set():
        try:
            if not ray.is_initialized():  # only inside Ray (Serve's controller); never start a cluster
                raise RuntimeError("not in a Ray process")
            if not actors:
                actors = [ray.get_actor(dispatcher_name(app, k), namespace="fairgate") for k in range(shards)]
            readings = ray.get([actor.demand.remote(model) for actor in actors], timeout=5.0)
            latest[:] = [(time.monotonic(), fleet_demand([Demand(**r) for r in readings]))]
        except Exception as exc:  # no dispatcher yet, or one restarts: keep the current target
            log.debug("fairgate autoscaling: no demand reading: %s", exc)
            actors = []
        stop.wait(interval_s)
