#!/usr/bin/env bash
# Lays out OUT (where build-tools.sh put pulumi and pulumi-resource-kubernetes) the way the
# Automation API and fusebox up expect: OUT/bin/pulumi, and OUT/home as PULUMI_HOME with the
# Kubernetes provider plugin installed. Idempotent.
set -euo pipefail
OUT=$(cd "${1:?OUT dir}" && pwd)
K8S_PROVIDER_VERSION=4.25.0
mkdir -p "$OUT/bin" "$OUT/home"
ln -sf ../pulumi "$OUT/bin/pulumi"
if [ ! -d "$OUT/home/plugins/resource-kubernetes-v$K8S_PROVIDER_VERSION" ]; then
  PULUMI_HOME="$OUT/home" PULUMI_SKIP_UPDATE_CHECK=true "$OUT/bin/pulumi" plugin install resource kubernetes \
    "v$K8S_PROVIDER_VERSION" --file "$OUT/pulumi-resource-kubernetes"
fi
"$OUT/bin/pulumi" version
