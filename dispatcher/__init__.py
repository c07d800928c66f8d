"""The control plane: the pure fairness core (``fairgate.core``) and its thin shells in one process,
the dispatcher actor (``actor``: a Ray actor around ``service``, the asyncio gRPC service every worker
streams its reports to), the tenant registry, the state store (memory or Redis) and what it measures
(``metrics``, ``otlp_metrics``). It sees metadata only, and imports nothing of any engine."""
