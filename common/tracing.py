"""OpenTelemetry traces: one trace per request, from the ingress into the worker across gRPC.

Off unless configured (``telemetry.otlp_endpoint`` exports over OTLP/gRPC; ``telemetry.traces: memory``
keeps finished spans in this process, for tests and benchmarks). When off, the OpenTelemetry API's
no-op tracer makes every call here nearly free.

A request's trace: ``fairgate.request`` (received; tenant, model, token counts) with children
``fairgate.queue`` (waiting in the dispatcher; the worker chosen and the tenant's counter after the
dispatch charge) and ``fairgate.generate`` (streaming; a ``first_token`` event; completion tokens and the
finish reason), and, in the worker's process, ``fairgate.worker.generate`` under ``fairgate.generate``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import context, propagate, trace
from opentelemetry.trace import Span, Status, StatusCode

from fairgate.common.config import TelemetrySettings

TRACER = "fairgate"
_memory: Any = None  # the in-memory exporter, when traces: memory
_provider: Any = None
_active = True  # benchmarks switch tracing off and on within one process


def configure_tracing(settings: TelemetrySettings | None, service: str) -> None:
    """Install this process's tracer provider (once per process; later calls change nothing)."""
    global _memory, _provider
    settings = settings or TelemetrySettings()
    endpoint, memory = settings.otlp_endpoint, settings.traces == "memory"
    if _provider is not None or not (endpoint or memory):
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    # the ingress decides per trace; workers follow the decision carried in the trace context
    sampler = ParentBased(TraceIdRatioBased(settings.trace_sample_ratio))
    provider = TracerProvider(resource=Resource.create({"service.name": service}), sampler=sampler)
    if endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    if memory:
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        _memory = InMemorySpanExporter()
        provider.add_span_processor(BatchSpanProcessor(_memory, schedule_delay_millis=200))
    trace.set_tracer_provider(provider)
    _provider = provider


def finished_spans() -> list[dict[str, Any]]:
    """The spans this process finished (traces: memory), as plain data."""
    if _memory is None:
        return []
    _provider.force_flush()
    out = []
    for s in _memory.get_finished_spans():
        out.append(
            {
                "name": s.name,
                "trace_id": f"{s.context.trace_id:032x}",
                "span_id": f"{s.context.span_id:016x}",
                "parent_id": f"{s.parent.span_id:016x}" if s.parent else None,
                "attributes": dict(s.attributes or {}),
                "events": [e.name for e in s.events],
                "status": s.status.status_code.name,
            }
        )
    return out


def tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER) if _active else _NO_OP


def set_tracing_active(active: bool) -> None:
    """Switch this process's spans off (a no-op tracer) and on again; for side-by-side benchmarks."""
    global _active
    _active = active


_NO_OP = trace.NoOpTracer()


def inject_context(span: Span) -> dict[str, str]:
    """W3C trace context for a call made under ``span`` (empty when tracing is off)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def extract_context(carrier: Mapping[str, Any] | None) -> context.Context:
    """The caller's trace context (empty when the caller sent none)."""
    return propagate.extract({k: v for k, v in (carrier or {}).items() if isinstance(v, str)})


class RequestTrace:
    """The spans of one request at the ingress; every method is safe when tracing is off."""

    def __init__(self, attributes: dict[str, Any]) -> None:
        self.request = tracer().start_span("fairgate.request", attributes=attributes)
        self._parent = trace.set_span_in_context(self.request)
        self.generate: Span | None = None

    def queue_span(self) -> Any:
        """Context manager around waiting for a placement."""
        return tracer().start_as_current_span("fairgate.queue", context=self._parent, end_on_exit=True)

    def dispatched(self, queue: Span, worker_id: str, counter: float) -> None:
        queue.set_attributes({"fairgate.worker": worker_id, "fairgate.counter": float(counter)})

    def start_generate(self, worker: str) -> dict[str, str]:
        """Start the streaming span; returns the trace context that carries it to the worker."""
        if self.generate is not None:  # placed again after its worker was lost: a new attempt
            self.generate.end()
        self.generate = tracer().start_span(
            "fairgate.generate", context=self._parent, attributes={"fairgate.worker": worker}
        )
        return inject_context(self.generate)

    def first_token(self) -> None:
        if self.generate is not None:
            self.generate.add_event("first_token")

    def finish(self, prompt_tokens: int, completion_tokens: int, finish_reason: str | None, error: str = "") -> None:
        attributes = {
            "fairgate.prompt_tokens": prompt_tokens,
            "fairgate.completion_tokens": completion_tokens,
            "fairgate.finish_reason": finish_reason or "",
        }
        for span in (self.generate, self.request):
            if span is None:
                continue
            span.set_attributes(attributes)
            if error:
                span.set_status(Status(StatusCode.ERROR, error))
            span.end()
