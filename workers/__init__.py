"""The worker replicas: the engine plug-ins (``fairgate.workers.engines``: the interface, the simulated engine
and vLLM), the worker shell that drives one engine behind gRPC (``worker``), its Ray Serve deployment
(``deployment``) and the autoscaling policy that sizes the deployment on the dispatcher's demand."""
