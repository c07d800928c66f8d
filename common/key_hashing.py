"""API keys are kept and compared only as keyed hashes: HMAC-SHA256, under a secret the state store
never holds, of the key's SHA-256 digest. A copy of Redis (a backup, a snapshot of its volume) then
lets no one test guesses of a weak key offline.

The secret is ``FAIRGATE_KEY_HASH_SECRET`` (or the file named by ``FAIRGATE_KEY_HASH_SECRET_FILE``), read
by each process that hashes keys (the app's builder, the ingress replicas, the dispatcher) and never
passed to another: a Ray actor's arguments are kept by Ray's GCS, which fault tolerance stores in
Redis. Without it the secret derives from the cluster secret (a local gateway). The processes compare
a fingerprint of the secret at start, so a mismatch fails loudly instead of refusing every key.

Keying the digest rather than the key lets stores written before keyed hashes be upgraded in place:
a stored digest (64 hex digits, no prefix) becomes its keyed hash, and no key needs to be known.
"""

from __future__ import annotations

import hashlib
import hmac

from fairgate.common.sections import MIN_SECRET_CHARS, ConfigError, secret_from_env

KEYED_PREFIX = "hk1:"  # a stored hash that is already keyed
SECRET_ENV = "FAIRGATE_KEY_HASH_SECRET"
_DERIVATION_LABEL = b"fairgate api key hashing v1"
_FINGERPRINT_LABEL = b"fairgate key hash secret fingerprint"


def key_digest(api_key: str) -> str:
    """The key's plain SHA-256: what a configuration holds until it is keyed, and what stores held
    before keyed hashes."""
    return hashlib.sha256(api_key.encode()).hexdigest()


class KeyHasher:
    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    @classmethod
    def from_environment(cls, cluster_secret: str) -> KeyHasher:
        """The hasher this process uses: ``FAIRGATE_KEY_HASH_SECRET`` when set, else one derived from
        the cluster secret."""
        given = secret_from_env(SECRET_ENV)
        if given is not None:
            if len(given) < MIN_SECRET_CHARS:
                raise ConfigError(f"{SECRET_ENV} must be at least {MIN_SECRET_CHARS} characters")
            return cls(given.encode())
        return cls(hmac.new(cluster_secret.encode(), _DERIVATION_LABEL, hashlib.sha256).digest())

    def of_key(self, api_key: str) -> str:
        return self.of_digest(key_digest(api_key))

    def of_digest(self, digest: str) -> str:
        return KEYED_PREFIX + hmac.new(self._secret, digest.encode(), hashlib.sha256).hexdigest()

    def upgrade(self, stored: str) -> str:
        """A stored hash as it is kept now: a plain digest becomes keyed, a keyed hash stays."""
        return stored if not stored or stored.startswith(KEYED_PREFIX) else self.of_digest(stored)

    def fingerprint(self) -> str:
        """Names the secret without revealing it: equal in every process that hashes keys alike."""
        return hmac.new(self._secret, _FINGERPRINT_LABEL, hashlib.sha256).hexdigest()[:16]

    def check_fingerprint(self, expected: str | None, where: str) -> None:
        if expected and not hmac.compare_digest(expected, self.fingerprint()):
            raise ConfigError(
                f"{where}: {SECRET_ENV} differs from the one the gateway was built with; every process that"
                " hashes API keys (the builder, the ingress replicas, the dispatcher) must see the same"
            )
