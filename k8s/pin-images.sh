#!/usr/bin/env bash
# Pin every image an overlay runs to the digest its tag names now, so that a pod restarted next month
# runs the bytes tested today (a tag can be pushed again; a digest cannot). Writes the overlay
# k8s/pinned/OVERLAY (git-ignored), which wraps k8s/overlays/OVERLAY with kustomize `images` digests:
#   bash k8s/pin-images.sh gpu && kubectl apply -k k8s/pinned/gpu
# Push the images first (and set their names, e.g. `kustomize edit set image fairgate=REGISTRY/fairgate:gpu`
# in the overlay). Digests come from `crane digest`, else `skopeo inspect`, else `docker buildx imagetools`;
# FAIRGATE_RESOLVE_DIGEST names another command (it gets the reference, prints sha256:...).
set -euo pipefail
overlay="${1:?usage: pin-images.sh OVERLAY (one of: $(ls "$(dirname "$0")/overlays" | tr '\n' ' '))}"
here="$(cd "$(dirname "$0")" && pwd)"
[ -d "$here/overlays/$overlay" ] || { echo "pin-images: no overlay $here/overlays/$overlay" >&2; exit 2; }

resolve() {
  if [ -n "${FAIRGATE_RESOLVE_DIGEST:-}" ]; then $FAIRGATE_RESOLVE_DIGEST "$1"
  elif command -v crane >/dev/null; then crane digest "$1"
  elif command -v skopeo >/dev/null; then skopeo inspect --format '{{.Digest}}' "docker://$1"
  elif command -v docker >/dev/null; then docker buildx imagetools inspect "$1" --format '{{json .Manifest.Digest}}' | tr -d '"'
  else echo "pin-images: need crane, skopeo or docker (or FAIRGATE_RESOLVE_DIGEST) to read digests" >&2; return 1
  fi
}

refs="$(kubectl kustomize "$here/overlays/$overlay" | sed -n 's/^[[:space:]-]*image:[[:space:]]*//p' | tr -d "\"'" | sort -u)"
entries=""
for ref in $refs; do
  case "$ref" in *@sha256:*) continue ;; esac  # pinned already
  last="${ref##*/}"
  name="$ref"
  case "$last" in *:*) name="${ref%:*}" ;; esac  # the tag goes; a registry's port stays
  digest="$(resolve "$ref")" || { echo "pin-images: cannot read the digest of $ref" >&2; exit 1; }
  if ! [[ "$digest" =~ ^sha256:[0-9a-f]{64}$ ]]; then
    echo "pin-images: $ref: not a digest: $digest" >&2
    exit 1
  fi
  entries+="  - name: $name"$'\n'"    digest: $digest  # was $ref"$'\n'
done
out="$here/pinned/$overlay"
mkdir -p "$out"
{
  echo "# Written by k8s/pin-images.sh $overlay on $(date -u +%Y-%m-%dT%H:%M:%SZ): $overlay with its images by digest."
  echo "apiVersion: kustomize.config.k8s.io/v1beta1"
  echo "kind: Kustomization"
  echo "resources:"
  echo "  - ../../overlays/$overlay"
  if [ -n "$entries" ]; then echo "images:"; printf '%s' "$entries"; fi
} > "$out/kustomization.yaml.tmp"
mv "$out/kustomization.yaml.tmp" "$out/kustomization.yaml"
echo "pinned $(printf '%s' "$entries" | grep -c 'digest:' || true) image(s): kubectl apply -k $out"
