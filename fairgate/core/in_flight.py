"""The requests handed to workers and not yet settled, and the scheduler's numbering of requests.

Every part that follows a request past its dispatch (its charges, revocation, recovery, the picks that
make room for an adapter) reads this table; only the scheduler's events add to it and remove from it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from fairgate.core.model import Request, request_from_dict


class InFlight:
    """Requests in flight by id (in the order they were handed out), and the scheduler's sequence: one
    number per submission, dispatch and adoption, so that orders between them are exact and a
    snapshot reproduces them."""

    __slots__ = ("_requests", "longest_output", "longest_prompt", "next_seq")

    def __init__(self) -> None:
        self._requests: dict[str, Request] = {}
        self.next_seq = 0
        self.longest_prompt = 0  # of every request submitted, and the largest max_tokens: for 2U
        self.longest_output = 0

    # ------------------------------------------------------------------ the table

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._requests

    def __len__(self) -> int:
        return len(self._requests)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._requests.values())

    def get(self, request_id: str) -> Request | None:
        return self._requests.get(request_id)

    def by_id(self) -> Mapping[str, Request]:
        """The table itself, read-only (the scheduler's ``in_flight()`` view)."""
        return self._requests

    def add(self, req: Request) -> None:
        self._requests[req.id] = req

    def remove(self, request_id: str) -> None:
        del self._requests[request_id]

    def on_worker(self, worker_id: str) -> list[Request]:
        return [r for r in self._requests.values() if r.worker == worker_id]

    def started_ids(self) -> list[str]:
        return [r.id for r in self._requests.values() if r.started]

    def unstarted(self) -> list[Request]:
        return [r for r in self._requests.values() if not r.started]

    # ------------------------------------------------------------------ numbering

    def take_seq(self) -> int:
        seq = self.next_seq
        self.next_seq += 1
        return seq

    def saw(self, prompt_tokens: int, max_tokens: int) -> None:
        """A request of this size was submitted (the bound's U grows with the largest)."""
        self.longest_prompt = max(self.longest_prompt, prompt_tokens)
        self.longest_output = max(self.longest_output, max_tokens)

    def longest(self) -> list[int]:
        return [self.longest_prompt, self.longest_output]

    def restore_longest(self, pair: Any) -> None:
        self.longest_prompt, self.longest_output = (int(v) for v in pair)

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> dict[str, Any]:
        return {
            "requests": [r.to_dict() for r in self._requests.values()],
            "next_seq": self.next_seq,
            "longest": self.longest(),
        }

    def restore(self, data: Mapping[str, Any]) -> None:
        self._requests = {r["id"]: request_from_dict(r) for r in data["requests"]}
        self.next_seq = int(data["next_seq"])
        self.restore_longest(data["longest"])
