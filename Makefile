# fusebox — make help lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

# The pinned gVisor: built from the Go module proxy into a versioned cache outside the repo.
RUNSC_VERSION ?= v0.0.0-20260905035102-160fafc42237
FUSEBOX_CACHE ?= /var/cache/fusebox
RUNSC_DIR     := $(FUSEBOX_CACHE)/runsc-$(RUNSC_VERSION)
RUNSC         ?= $(RUNSC_DIR)/runsc
export FUSEBOX_RUNSC := $(RUNSC)

# The Kubernetes test control plane (etcd, kube-apiserver, kube-controller-manager, kubectl,
# kwok), built from the Go module proxy by hack/k8s/build-bins.sh into a versioned cache
# outside the repo.
K8S_VERSION ?= v1.37.2
K8S_BIN     ?= $(FUSEBOX_CACHE)/k8s-$(K8S_VERSION)
# The Pulumi CLI and Kubernetes provider, built from the Go module proxy by
# hack/pulumi/build-tools.sh and laid out (bin/pulumi, home/ = PULUMI_HOME) by setup-tools.sh.
PULUMI_TOOLS ?= $(FUSEBOX_CACHE)/pulumi-v3.274.1-k8s-4.25.0
export FUSEBOX_PULUMI_TOOLS := $(PULUMI_TOOLS)
# A real node's binaries (containerd, the gVisor shim, kubelet, kube-scheduler, kube-proxy, CNI
# plugins, kube-router), built from the Go module proxy by hack/node/build-bins.sh.
NODE_BIN ?= $(FUSEBOX_CACHE)/node-containerd-v2.4.2-k8s-$(K8S_VERSION)
export FUSEBOX_NODE_BIN := $(NODE_BIN)
# Packages of the main test run: test/kube runs only through test-kube.
MAIN_PKGS = $$(go list ./... | grep -vE '/test/kube(/|$$)')

BIN      := bin
GOTEST   ?= go test
TESTFLAGS ?= -race -count=1 -timeout 30m

.PHONY: help build test unit verify generate bench run runsc deps clean k8s-bins test-kube tools node-bins

help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  make %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

deps: ## Install the Debian packages the build and tests need (root)
	@command -v protoc >/dev/null || { apt-get update -qq && apt-get install -y -qq protobuf-compiler; }

runsc: $(RUNSC) ## Build the pinned gVisor runsc into the cache (about 6 min cold)

$(RUNSC):
	@echo "building runsc $(RUNSC_VERSION) into $(RUNSC_DIR) (about 6 minutes cold)"
	@mkdir -p $(RUNSC_DIR).tmp
	GOBIN=$(abspath $(RUNSC_DIR)).tmp GOFLAGS=-mod=mod CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" gvisor.dev/gvisor/runsc@$(RUNSC_VERSION)
	@rm -rf $(RUNSC_DIR) && mv $(RUNSC_DIR).tmp $(RUNSC_DIR)
	@$(RUNSC) --version | head -1

build: ## Build fusebox and the static fusebox-sandbox into bin/
	@mkdir -p $(BIN)
	CGO_ENABLED=0 go build -trimpath -o $(BIN)/fusebox-sandbox ./cmd/fusebox-sandbox
	go build -trimpath -o $(BIN)/fusebox ./cmd/fusebox

generate: ## Regenerate the protobuf Go code with the pinned generators
	./hack/generate.sh

verify: deps ## Regenerate and fail on any diff; gofmt; go vet; dependency rules
	./hack/verify.sh

unit: ## Run the tests that need neither root nor gVisor
	FUSEBOX_SKIP_RUNSC=1 FUSEBOX_SKIP_KUBE=1 $(GOTEST) $(TESTFLAGS) ./...

test: deps runsc verify k8s-bins tools ## Verify, then run every test, gVisor and Kubernetes integration tests included (root)
	$(GOTEST) $(TESTFLAGS) $(MAIN_PKGS)
	$(MAKE) test-kube

k8s-bins: ## Build etcd, kube-apiserver, kube-controller-manager, kubectl and kwok into the cache when absent (about 35 CPU-min cold)
	@if [ -x $(K8S_BIN)/etcd ] && [ -x $(K8S_BIN)/kube-apiserver ] && [ -x $(K8S_BIN)/kube-controller-manager ] && \
		[ -x $(K8S_BIN)/kwok ] && [ -f $(K8S_BIN)/kwok-stages.yaml ]; then \
		echo "kubernetes test binaries present in $(K8S_BIN)"; \
	else ./hack/k8s/build-bins.sh $(K8S_BIN); fi

node-bins: ## Build containerd, the gVisor shim, kubelet, kube-scheduler, kube-proxy, CNI plugins and kube-router into the cache when absent
	./hack/node/build-bins.sh $(NODE_BIN)

tools: ## Build the Pulumi CLI and Kubernetes provider into the cache when absent (about 40 CPU-min cold)
	./hack/pulumi/build-tools.sh $(PULUMI_TOOLS)
	./hack/pulumi/setup-tools.sh $(PULUMI_TOOLS)

test-kube: k8s-bins ## Run the kube allocator's tests against a real API server (etcd, kube-apiserver, kwok on loopback)
	FUSEBOX_K8S_BIN=$(K8S_BIN) $(GOTEST) -race -count=1 -timeout 10m ./test/kube/...

bench: runsc build ## Run the benchmarks under gVisor and print JSON
	$(BIN)/fusebox bench dataplane --runsc $(RUNSC) --json
	$(BIN)/fusebox bench allocate --runsc $(RUNSC) --json
	$(BIN)/fusebox bench manager --json

run: runsc build ## Build everything and run the local manager (gVisor warm pool) in the foreground
	@echo "starting fusebox local up; in another terminal: $(BIN)/fusebox run -- uname -a"
	$(BIN)/fusebox local up --runsc $(RUNSC) $(RUN_FLAGS)

clean: ## Remove build outputs (not the runsc cache)
	rm -rf $(BIN)
