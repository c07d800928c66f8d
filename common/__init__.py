"""The shared floor: what every process of the gateway uses, and nothing above it. The wire contracts
(``rpc``: stubs generated from ``proto/``), assignment tickets and worker credentials (``tickets``),
tracing (``tracing``), keeping listeners on loopback (``loopback``) and the configuration schema
(``config``). It imports only the pure core (to check policy and cost names)."""
