"""Why the core refused a request or ended it early: the words it answers with, which the ingress maps
to OpenAI-shaped errors (``fairgate.ingress.errors``)."""

REJECT_RATE_LIMITED = "rate_limited"  # the policy's admission refused it (rpm:N)
REJECT_TOO_LARGE = "too_large"  # prompt + max_tokens larger than any worker's KV pool: it could never finish
REJECT_TENANT_QUEUE_FULL = "tenant_queue_full"  # limits.max_queued_per_tenant
REJECT_QUEUE_FULL = "queue_full"  # limits.max_queued
REJECT_QUEUE_TIMEOUT = "queue_timeout"  # waited longer than limits.max_queue_s
REJECT_OBJECTIVE = "objective_unreachable"  # its class sheds requests predicted to miss its ttft_s
FINISH_REVOKED = "revoked"  # taken back from its worker before its engine started it (revoke): it waits again
FINISH_WORKER_LOST = "worker_lost"  # it had started on a worker that is gone
REJECT_QUOTA = "insufficient_quota"  # its tenant's (or a node's above it) token quota has too little left
REJECT_UNKNOWN_KEY = "unknown_key"  # the dispatcher's tenant registry: the key was revoked or rotated
