#!/usr/bin/env bash
# Write random secrets for k8s/base's secretGenerator into k8s/base/secrets/ (git-ignored):
# the admin key, the cluster secret, the API keys' hashing secret, Redis's password (and the head's Redis URL with it), and
# tenants.yaml with a random API key per tenant.
#   bash k8s/make-secrets.sh alice bob carol      (default tenants: alice bob)
set -euo pipefail
dir="$(cd "$(dirname "$0")" && pwd)/base/secrets"
mkdir -p "$dir"
umask 077
random() { python3 -c "import secrets; print('$1' + secrets.token_urlsafe($2))"; }
[ -s "$dir/admin-key" ] || random fg-admin- 32 > "$dir/admin-key"
[ -s "$dir/cluster-secret" ] || random "" 48 > "$dir/cluster-secret"
[ -s "$dir/key-hash-secret" ] || random "" 48 > "$dir/key-hash-secret"
[ -s "$dir/redis-password" ] || random "" 32 | tr -d '\n' > "$dir/redis-password"
[ -s "$dir/redis-url" ] || echo "redis://:$(cat "$dir/redis-password")@fairgate-redis:6379/0" > "$dir/redis-url"
if [ ! -s "$dir/tenants.yaml" ]; then
  for name in "${@:-alice bob}"; do
    for t in $name; do echo "- {name: $t, weight: 1, api_key: $(random fg- 32)}"; done
  done > "$dir/tenants.yaml"
fi
echo "secrets in $dir (kept if present): admin-key, cluster-secret, key-hash-secret, redis-password, redis-url, tenants.yaml"
