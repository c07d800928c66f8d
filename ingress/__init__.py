"""The HTTP front of the gateway: a stateless Ray Serve deployment (``deployment``) that speaks OpenAI's
API (``openai_api`` requests, ``responses``), authenticates tenants and the admin (``auth``,
``admin_api``), turns a request into what the dispatcher admits (``prompting``), streams the text from
the assigned worker (``generation``), maps refusals to OpenAI errors (``errors``), and serves
``/metrics`` (``prometheus``) and the live page (``dashboard.html``)."""
