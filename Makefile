# fusebox — make help lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

# The pinned gVisor: built from the Go module proxy into a versioned cache outside the repo.
RUNSC_VERSION ?= v0.0.0-20260905035102-160fafc42237
FUSEBOX_CACHE ?= /var/cache/fusebox
RUNSC_DIR     := $(FUSEBOX_CACHE)/runsc-$(RUNSC_VERSION)
RUNSC         ?= $(RUNSC_DIR)/runsc
export FUSEBOX_RUNSC := $(RUNSC)
# containerd-shim-runsc-v1 from the same gVisor module version, for the node installer image.
SHIM_DIR      := $(FUSEBOX_CACHE)/shim-$(RUNSC_VERSION)
SHIM          ?= $(SHIM_DIR)/containerd-shim-runsc-v1
export FUSEBOX_SHIM := $(SHIM)
# Images (fusebox image build): the manager's main package and where the layouts go.
MANAGER_PKG   ?= ./cmd/fusebox-manager
IMAGES        ?= $(BIN)/images

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
# containerd 1.7 (the containerd of AKS's config-version-2 nodes), built by
# hack/node/build-containerd17.sh: components/gvisor's tests load the node installer's config
# with it.
CONTAINERD17_DIR ?= $(FUSEBOX_CACHE)/containerd-v1.7.35
export FUSEBOX_CONTAINERD17 := $(CONTAINERD17_DIR)/containerd
# Cilium's agent and CNI plugin, the datapath's sources and the CRDs (hack/cilium/build.sh),
# for the real-node tests' cilium flavour (test/cilium).
CILIUM_BIN ?= $(FUSEBOX_CACHE)/cilium-v1.20.2
export FUSEBOX_CILIUM_BIN := $(CILIUM_BIN)
# Packages of the main test run: test/kube, test/cluster, test/cilium and test/clusterup run
# only through test-kube and test-cluster. Those NORACE matches run without the race detector:
# their tests build, copy, hash, compress and unpack whole images and Debian roots in the test
# process (template builds, image builds, the layer store, the images of `fusebox local up`'s
# templates), which the detector slows manyfold, while what they run concurrently is runsc's
# processes and the built binaries (no race build either), not the test's goroutines. The
# packages those binaries are made of have race-tested unit tests of their own.
NORACE = /internal/(templatebuild|image)$$|/test/(localimage|imagebuild|managere2e)$$
MAIN_PKGS = $$(go list ./... | grep -vE '/test/(kube|cluster|cilium|clusterup)(/|$$)|$(NORACE)')
NORACE_PKGS = $$(go list ./... | grep -E '$(NORACE)')

BIN      := bin
# The Python SDK is built and tested with Debian's interpreter and packages, not whatever
# python3 is first on PATH.
PYTHON   ?= /usr/bin/python3
# Every binary make build puts in bin/: the products (fusebox, fusebox-manager, fusebox-sandbox;
# hack/deps-lists.sh checks what they link) and the benchmarks' (fusebox-bench, and
# fusebox-floor, which fusebox-bench dataplane runs inside its sandbox). All static and stripped.
BINARIES := fusebox fusebox-manager fusebox-sandbox fusebox-bench fusebox-floor
GOTEST   ?= go test
TESTFLAGS ?= -race -count=1 -timeout 30m

.PHONY: deps-run prepare toolchains toolchains-a toolchains-b userlands help build test unit verify generate deps-lists bench run runsc shim images deps clean k8s-bins containerd17 nodeadm-check test-kube tools test-python bench-python node-bins cilium test-cluster

help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  make %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

deps-run: ## Install the Debian packages make run needs (root)
	@command -v mmdebstrap >/dev/null || { echo "installing mmdebstrap (the sandbox image's Debian userland)"; \
		apt-get update -qq && apt-get install -y -qq mmdebstrap; }

deps: deps-run ## Install the Debian packages the build and tests need (root)
	@command -v protoc >/dev/null || { apt-get update -qq && apt-get install -y -qq protobuf-compiler; }
	@command -v docker-registry >/dev/null || { apt-get update -qq && apt-get install -y -qq docker-registry; }
	@command -v htpasswd >/dev/null || { apt-get update -qq && apt-get install -y -qq apache2-utils; }
	@command -v iptables >/dev/null && command -v ipset >/dev/null || { apt-get update -qq && apt-get install -y -qq iptables ipset; }
	@command -v clang-19 >/dev/null && command -v llc-19 >/dev/null || { apt-get update -qq && apt-get install -y -qq clang-19 llvm-19; }
	@command -v grpc_python_plugin >/dev/null || { apt-get update -qq && apt-get install -y -qq protobuf-compiler-grpc; }
	@$(PYTHON) -c 'import grpc, google.protobuf, cryptography, pytest, pytest_asyncio' 2>/dev/null || { apt-get update -qq && \
		apt-get install -y -qq python3-grpcio python3-protobuf python3-cryptography python3-pytest python3-pytest-asyncio; }

runsc: $(RUNSC) ## Build the pinned gVisor runsc into the cache when absent

$(RUNSC):
	@echo "make: building runsc $(RUNSC_VERSION) into $(RUNSC_DIR) (once; several minutes cold)"
	@mkdir -p $(RUNSC_DIR).tmp
	GOBIN=$(abspath $(RUNSC_DIR)).tmp GOFLAGS=-mod=mod CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" gvisor.dev/gvisor/runsc@$(RUNSC_VERSION)
	@rm -rf $(RUNSC_DIR) && mv $(RUNSC_DIR).tmp $(RUNSC_DIR)
	@$(RUNSC) --version | head -1

shim: $(SHIM) ## Build containerd-shim-runsc-v1 (same gVisor version) into the cache when absent

$(SHIM):
	@echo "make: building containerd-shim-runsc-v1 $(RUNSC_VERSION) into $(SHIM_DIR) (once; minutes cold)"
	@rm -rf $(SHIM_DIR).tmp && mkdir -p $(SHIM_DIR).tmp
	GOBIN=$(abspath $(SHIM_DIR)).tmp GOFLAGS=-mod=mod CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" gvisor.dev/gvisor/shim@$(RUNSC_VERSION)
	@mv $(SHIM_DIR).tmp/shim $(SHIM_DIR).tmp/containerd-shim-runsc-v1
	@rm -rf $(SHIM_DIR) && mv $(SHIM_DIR).tmp $(SHIM_DIR)

# What the build printed goes to $(IMAGES)/built.txt too: the tests that take the release
# images read it (test/imagetest, FUSEBOX_IMAGES) rather than building their own.
images: runsc shim build ## Build the manager, sandbox and gVisor installer images (layouts and archives) into bin/images (userland cached in FUSEBOX_CACHE)
	@mkdir -p $(IMAGES)
	set -o pipefail; $(BIN)/fusebox image build --tar --out $(abspath $(IMAGES)) --runsc $(RUNSC) --shim $(SHIM) \
		--manager-package $(MANAGER_PKG) --cache $(FUSEBOX_CACHE) | tee $(IMAGES)/built.txt.tmp
	@mv $(IMAGES)/built.txt.tmp $(IMAGES)/built.txt

build: ## Build fusebox, fusebox-manager, fusebox-sandbox, fusebox-bench and fusebox-floor (static) into bin/
	@mkdir -p $(BIN)
	@for b in $(BINARIES); do \
		echo "CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o $(BIN)/$$b ./cmd/$$b"; \
		CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o $(BIN)/$$b ./cmd/$$b || exit 1; \
	done

generate: ## Regenerate the protobuf Go and Python code with the pinned generators, and the dependency lists
	./hack/generate.sh
	./hack/deps-lists.sh

deps-lists: ## Rewrite each product binary's dependency list (cmd/*/deps.txt; make verify checks them)
	./hack/deps-lists.sh

verify: deps ## Regenerate and fail on any diff; gofmt; go vet; dependency rules
	./hack/verify.sh

unit: ## Run the tests that need neither root nor gVisor
	FUSEBOX_SKIP_RUNSC=1 FUSEBOX_SKIP_KUBE=1 $(GOTEST) $(TESTFLAGS) ./...

# The tests run the binaries make build made ($FUSEBOX_BIN) rather than each building its own,
# and find the Debian userlands cached: hack/userlands builds them beside the toolchains.
test: deps prepare verify build images ## Verify, build every image, then run every test, gVisor, Kubernetes and real-node tests included (root)
	FUSEBOX_BIN=$(abspath $(BIN))/fusebox FUSEBOX_IMAGES=$(abspath $(IMAGES)) $(GOTEST) $(TESTFLAGS) $(MAIN_PKGS)
	FUSEBOX_BIN=$(abspath $(BIN))/fusebox FUSEBOX_IMAGES=$(abspath $(IMAGES)) $(GOTEST) $(filter-out -race,$(TESTFLAGS)) $(NORACE_PKGS)
	$(MAKE) test-python
	$(MAKE) test-kube
	$(MAKE) test-cluster FUSEBOX_IMAGES=$(abspath $(IMAGES))

# pytest fails on no tests collected (exit 5) as on a failure, and the end-to-end tests fail
# rather than skip without runsc or root (FUSEBOX_SKIP_RUNSC=1 skips them explicitly).
test-python: deps runsc build ## Run the Python SDK's tests with Debian's python3: unit, and end to end against `fusebox local up` under gVisor (root)
	cd client/python && FUSEBOX_BIN=$(abspath $(BIN))/fusebox PYTHONDONTWRITEBYTECODE=1 $(PYTHON) -m pytest -p no:cacheprovider -q -rs

bench-python: runsc build ## Benchmark the Python SDK against the Go SDK in one run (client/python/bench.py)
	FUSEBOX_BIN=$(abspath $(BIN))/fusebox $(PYTHON) client/python/bench.py $(BENCH_FLAGS)

# The toolchains compile (CPU) while mmdebstrap fetches and unpacks packages (network, disk).
# They build in two lanes: one go build alone leaves a CPU idle while it links a large
# binary or compiles a large package that the rest waits for; the other lane fills it.
prepare: ## Build the toolchains the tests need and, beside them, the cached Debian userlands (root)
	$(MAKE) -j3 toolchains userlands

toolchains: toolchains-a toolchains-b

toolchains-a: # each lane one build after another
	$(MAKE) --no-print-directory runsc
	$(MAKE) --no-print-directory shim
	$(MAKE) --no-print-directory k8s-bins
	$(MAKE) --no-print-directory nodeadm-check

toolchains-b:
	$(MAKE) --no-print-directory node-bins
	$(MAKE) --no-print-directory containerd17
	$(MAKE) --no-print-directory cilium
	$(MAKE) --no-print-directory tools

userlands: ## Build the Debian userlands of the release images and the tests into the cache when absent (root)
	@echo "make: the Debian userlands of the images and tests, cached in $(FUSEBOX_CACHE) (mmdebstrap, once)"
	FUSEBOX_CACHE=$(FUSEBOX_CACHE) go run ./hack/userlands

k8s-bins: ## Build etcd, kube-apiserver, kube-controller-manager and kwok into the cache when absent
	@if [ -x $(K8S_BIN)/etcd ] && [ -x $(K8S_BIN)/kube-apiserver ] && [ -x $(K8S_BIN)/kube-controller-manager ] && \
		[ -x $(K8S_BIN)/kwok ] && [ -f $(K8S_BIN)/kwok-stages.yaml ]; then \
		echo "kubernetes test binaries present in $(K8S_BIN)"; \
	else echo "make: building the Kubernetes test binaries into $(K8S_BIN) (once; tens of CPU-minutes cold)"; \
		./hack/k8s/build-bins.sh $(K8S_BIN); fi

containerd17: ## Build containerd 1.7 (the installer tests' second containerd) into the cache when absent
	./hack/node/build-containerd17.sh $(CONTAINERD17_DIR)

node-bins: ## Build containerd, the gVisor shim, kubelet, kube-scheduler, kube-proxy, CNI plugins and kube-router into the cache when absent
	./hack/node/build-bins.sh $(NODE_BIN)

# nodeadm's containerd config checker (hack/nodeadm: nodeadm's own code from the Go module
# proxy), for components/gvisor's EKS userData test (FUSEBOX_NODEADM_BIN).
NODEADM_BIN ?= $(FUSEBOX_CACHE)/nodeadm-v0.0.0-20260213141146-147b13ea3f4a
export FUSEBOX_NODEADM_BIN := $(NODEADM_BIN)
nodeadm-check: ## Build nodeadm's containerd config checker into the cache when absent
	./hack/nodeadm/build.sh $(NODEADM_BIN)

cilium: ## Build Cilium's agent and CNI plugin (with the datapath's sources and CRDs) into the cache when absent
	./hack/cilium/build.sh $(CILIUM_BIN)

tools: ## Build the Pulumi CLI and Kubernetes provider into the cache when absent
	./hack/pulumi/build-tools.sh $(PULUMI_TOOLS)
	./hack/pulumi/setup-tools.sh $(PULUMI_TOOLS)

test-kube: k8s-bins ## Run the kube allocator's tests against a real API server (etcd, kube-apiserver, kwok on loopback)
	FUSEBOX_K8S_BIN=$(K8S_BIN) $(GOTEST) -race -count=1 -timeout 10m ./test/kube/...

# test/clusterup runs fusebox up onto a real node with the images bin/fusebox image build
# makes (the userland cached in FUSEBOX_CACHE) and the Pulumi tools.
test-cluster: runsc shim k8s-bins node-bins cilium tools build ## Run the tests on a real node: kubelet, containerd and the gVisor shim; bridge CNI and kube-router, or Cilium; and fusebox up onto one (root)
	FUSEBOX_K8S_BIN=$(K8S_BIN) FUSEBOX_BIN=$(abspath $(BIN))/fusebox $(if $(FUSEBOX_IMAGES),FUSEBOX_IMAGES=$(FUSEBOX_IMAGES)) \
		$(GOTEST) -race -count=1 -p 1 -timeout 40m ./test/cluster/... ./test/cilium/... ./test/clusterup/...

bench: runsc build ## Run the benchmarks under gVisor and print JSON
	$(BIN)/fusebox-bench dataplane --runsc $(RUNSC) --json
	$(BIN)/fusebox-bench allocate --runsc $(RUNSC) --json
	$(BIN)/fusebox-bench manager --json
	$(BIN)/fusebox-bench cpu-limits --runsc $(RUNSC) --json

# The sandbox image make run gives its sandboxes as their root (fusebox image build writes one
# OCI image layout per image under $(BIN)/images). It is built the first time, and again when
# the sandbox server changed (bin/fusebox-sandbox differs from the one recorded at the last
# build); RUN_IMAGE= (empty) runs on a root assembled from this host instead.
SANDBOX_IMAGE := $(IMAGES)/sandbox
RUN_IMAGE     ?= $(SANDBOX_IMAGE)

run: deps-run runsc build ## Build everything (the sandbox image the first time) and run the local manager (gVisor warm pool) in the foreground
	@if [ "$(RUN_IMAGE)" = "$(SANDBOX_IMAGE)" ]; then \
		sum=$$(sha256sum $(BIN)/fusebox-sandbox | cut -d' ' -f1); \
		if [ ! -f $(SANDBOX_IMAGE)/index.json ] || [ "$$(cat $(SANDBOX_IMAGE).built-from 2>/dev/null)" != "$$sum" ]; then \
			echo "building the sandbox image into $(SANDBOX_IMAGE) (the first time: a Debian 12 userland with mmdebstrap, then cached)"; \
			$(BIN)/fusebox image build --image sandbox --out $(IMAGES) && echo "$$sum" > $(SANDBOX_IMAGE).built-from || exit 1; \
		fi; \
	fi
	@echo "starting fusebox local up; in another terminal: $(BIN)/fusebox run -- uname -a"
	$(BIN)/fusebox local up --runsc $(RUNSC) $(if $(RUN_IMAGE),--image $(RUN_IMAGE)) $(RUN_FLAGS)

clean: ## Remove build outputs (not the runsc cache)
	rm -rf $(BIN)
