#!/usr/bin/env bash
# Regenerates the Go code for every .proto under proto/ with pinned tools: Debian's protoc
# (protobuf-compiler 3.21.12 on bookworm) and protoc-gen-go / protoc-gen-go-grpc at the versions
# go.mod pins as tools. The output is committed; `make verify` fails when it differs.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v protoc >/dev/null || { echo "protoc not found: apt-get install -y protobuf-compiler" >&2; exit 1; }
bin=$(mktemp -d); trap 'rm -rf "$bin"' EXIT
go build -o "$bin/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go
go build -o "$bin/protoc-gen-go-grpc" google.golang.org/grpc/cmd/protoc-gen-go-grpc
find proto -name '*.pb.go' -delete
mapfile -t protos < <(find proto -name '*.proto' | sort)
PATH="$bin:$PATH" protoc -I proto -I /usr/include \
  --go_out=. --go_opt=module=github.com/fusebox-dev/fusebox \
  --go-grpc_out=. --go-grpc_opt=module=github.com/fusebox-dev/fusebox \
  "${protos[@]}"
