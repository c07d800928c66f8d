"""fairgate's load side: paper workloads and traces, the offline simulator (the real core and the shared
engine model in virtual time), the HTTP replay against any OpenAI endpoint, metrics, reports, plots,
and the benches of the core, the gateway and vLLM."""
