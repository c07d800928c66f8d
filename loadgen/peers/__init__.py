"""``fairgate bench peers``: fairgate against the routers users would run instead, on the same engines
and the same traffic (docs/peers.md)."""
