"""What a tenant, a node of the tenant tree and a request class may be: one schema for the gateway's
configuration, the workload specs and the admin API's checks (with the core's weight rule,
``fairgate.core.weights``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fairgate.common.sections import Section
from fairgate.core.classes import RequestClass
from fairgate.core.weights import MAX_WEIGHT

MAX_GROUP_CHARS = 64  # a cache group's name
MIN_KEY_CHARS = 16  # an API key (tenants' and the admin's)


class TenantEntry(Section):
    """A tenant as the configuration lists it: ``api_key`` (at least 16 characters; none: one is
    generated and shown once), ``weight``, ``cache_group`` (tenants of one group share cached prefixes;
    "": its own, apart), ``parent`` (its node in the tenant tree; "": the root), ``classes`` (the request
    classes it may use; none listed: every class that is not strict)."""

    name: str = Field(min_length=1, description="the tenant's name")
    api_key: str | None = Field(None, min_length=MIN_KEY_CHARS, description="its key (none: generated, shown once)")
    weight: float = Field(1.0, gt=0, le=MAX_WEIGHT, description="its share against its siblings")
    cache_group: str = Field("", max_length=MAX_GROUP_CHARS, description="tenants of one group share cached prefixes")
    parent: str = Field("", description="its tree node (none: the root)")
    classes: list[str] = Field(default_factory=list, description="classes it may use (none: all not strict)")


class TenantConfig(Section):
    """A tenant as the gateway keeps it: its key's hash, never the key."""

    name: str
    key_hash: str
    weight: float = Field(1.0, gt=0, le=MAX_WEIGHT)
    cache_group: str = Field("", max_length=MAX_GROUP_CHARS)
    parent: str = ""
    classes: tuple[str, ...] = ()


class NodeConfig(Section):
    """A node of the tenant tree (an organisation, a team): tenants and nodes under it share its weight."""

    name: str = Field(min_length=1, max_length=64, description="the node's name")
    parent: str = Field("", description="its parent node (none: the root)")
    weight: float = Field(1.0, gt=0, le=MAX_WEIGHT, description="its share against its siblings")


class ClassConfig(Section):
    """A request class (docs/architecture.md), chosen by the client with OpenAI's ``service_tier`` (``tier``, by
    default the class's name, e.g. ``flex`` for batch); ``strict``: served before every other class
    (operators); ``ttft_s``: its first-token objective (within the class, earliest deadline first)."""

    name: str = Field(min_length=1, max_length=32, description="the class's name")
    weight: float = Field(1.0, gt=0, le=MAX_WEIGHT, description="its share against the key's other classes")
    tier: str = Field("", description="the service_tier that asks for it (none: its name)")
    strict: bool = Field(False, description="served before every other class, charged to no node")
    ttft_s: float | None = Field(None, gt=0, description="its first-token objective, in seconds")
    on_miss: Literal["queue", "shed", "downgrade"] = Field(
        "queue",
        description="a request predicted to miss ttft_s: queue (waits anyway), shed (refused at once, 503"
        " with Retry-After) or downgrade (served in downgrade_to)",
    )
    downgrade_to: str = Field("", description="the class a downgraded request is served in (on_miss: downgrade)")

    @property
    def tier_name(self) -> str:
        """The service_tier that asks for it."""
        return self.tier or self.name

    def request_class(self) -> RequestClass:
        """The core's request class."""
        return RequestClass(self.name, self.weight, self.strict, self.ttft_s, self.on_miss, self.downgrade_to)


class AdapterConfig(Section):
    """A LoRA adapter served as a model of its own (docs/gateway.md, "Adapters"): requests whose
    ``model`` is ``name`` run on ``base_model``'s pool with the weights at ``path`` (a directory as
    ``peft`` saves one, readable by that pool's workers), for the tenants under ``nodes``."""

    name: str = Field(min_length=1, max_length=128, description="the model name clients ask for")
    base_model: str = Field(min_length=1, description="the model pool it runs on (its workers set max_loras)")
    path: str = Field(min_length=1, max_length=4096, description="where the workers read its weights")
    nodes: list[str] = Field(
        min_length=1, description="tree nodes or tenants whose tenants may use it ('' : every tenant)"
    )
