#!/usr/bin/env bash
# Checks deploy/ offline (rules, dashboard, Kubernetes manifests, compose,
# Dockerfile) against the code: see deploy/validate/doc.go. A separate Go
# module, so the product's go.mod stays lean; the root's `go test ./...`
# does not descend into it.
set -euo pipefail
cd "$(dirname "$0")"
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
  echo "gofmt would change: $unformatted" >&2
  exit 1
fi
go vet ./...
go test -count=1 "$@" ./...
