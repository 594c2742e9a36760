#!/usr/bin/env bash
# Fails when generated code is stale, code is not gofmt'ed, go vet complains, or the sandbox
# binary depends on something it must not (manager code, client-go, cgo).
set -euo pipefail
cd "$(dirname "$0")/.."
./hack/generate.sh
generated=(proto client/python/fusebox/_proto)
if ! git diff --quiet -- "${generated[@]}"; then
  git --no-pager diff --stat -- "${generated[@]}"
  echo "generated code is stale: run make generate and commit" >&2; exit 1
fi
if untracked=$(git ls-files --others --exclude-standard "${generated[@]}") && [ -n "$untracked" ]; then
  echo "generated files not committed: $untracked" >&2; exit 1
fi
unformatted=$(gofmt -l $(git ls-files '*.go' | grep -v '\.pb\.go$') 2>&1 || true)
if [ -n "$unformatted" ]; then echo "gofmt needed: $unformatted" >&2; exit 1; fi
go vet ./...
# fusebox-sandbox runs inside every sandbox: it stays small and never imports the manager,
# the client SDK or Kubernetes libraries.
bad=$(go list -deps ./cmd/fusebox-sandbox | grep -E '^github.com/fusebox-dev/fusebox/(manager|client)|^k8s.io/|^github.com/pulumi/' || true)
if [ -n "$bad" ]; then echo "fusebox-sandbox must not depend on: $bad" >&2; exit 1; fi
CGO_ENABLED=0 go build -o /dev/null ./cmd/fusebox-sandbox
echo "verify: ok"
