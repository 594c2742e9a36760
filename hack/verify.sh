#!/usr/bin/env bash
# Fails when generated code is stale, code is not gofmt'ed, go vet complains, or a product
# binary's dependency list is stale or names something it must not link (hack/deps-lists.sh),
# or the sandbox server or the manager does not build static.
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
# vet, the static builds below and make build compile with the same settings (no cgo, paths
# trimmed): one compile of each package serves the three.
CGO_ENABLED=0 go vet -trimpath ./...
# What each product binary links: its committed list (cmd/*/deps.txt) and the rules (no test
# or benchmark code; no Pulumi SDK in fusebox-manager and fusebox-sandbox; fusebox-sandbox, which
# runs inside every sandbox, without the manager, the client SDK or Kubernetes libraries).
./hack/deps-lists.sh --check
# The trust core (the fuse, pinning, the manager's side of sFuse) imports no latency
# accelerator, directly or through another package, so that it can be read alone.
core=(./sandbox-server/fuse ./internal/tlspin ./internal/coalesce ./internal/sfuse ./internal/endpoint)
wing='/internal/fastpath(/.*)?$'
if bad=$(go list -deps -test "${core[@]}" | grep -E "$wing"); then
  echo "the trust core (${core[*]}) imports accelerator packages: $bad" >&2; exit 1
fi
# The sandbox server and the in-cluster manager are static binaries.
for b in fusebox-sandbox fusebox-manager; do CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o /dev/null ./cmd/$b; done
echo "verify: ok"
