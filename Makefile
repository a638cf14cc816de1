# Each target is a thin call into hack/, whose scripts also run by hand.
SHELL := /bin/bash
.DEFAULT_GOAL := help

BIN      ?= bin
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -X github.com/gpu-injector/gpu-injector/version.Version=$(VERSION)

# K8S_VERSION=v1.X.Y runs the local cluster (make e2e, make test, make demo, make
# tools) on that Kubernetes release instead of e2e/cluster/versions.env's.
ifdef K8S_VERSION
export KUBERNETES_VERSION := $(K8S_VERSION)
endif

.PHONY: help
help: ## show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  \033[36m%-10s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## build bin/gpu-injector (cgo, for NVML)
	CGO_ENABLED=1 go build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/gpu-injector .

.PHONY: image
image: ## the container image without Docker (go-containerregistry): _output/gpu-injector-image.tar (this machine, docker-archive) and _output/gpu-injector-image-oci.tar (linux/amd64 + linux/arm64 index, OCI image layout tar; reproducible, SOURCE_DATE_EPOCH; installs the arm64 cross compiler if missing)
	go run ./hack/image -o _output/gpu-injector-image.tar -oci _output/gpu-injector-image-oci.tar

.PHONY: release
release: ## a release into _output/release/ (docs/release.md): make release VERSION=x.y.z; COSIGN_KEY=cosign.key (password: COSIGN_PASSWORD) signs it; RELEASE_FLAGS="--push REGISTRY" also pushes image and chart
	hack/release.sh $(RELEASE_FLAGS) $(VERSION)

.PHONY: test
test: ## everything CI runs: lint, unit, golden, chart and the e2e suite on a real local cluster
	hack/test.sh

.PHONY: unit
unit: ## unit, golden and handler tests only (no cluster)
	hack/test.sh unit

.PHONY: e2e
e2e: ## end-to-end tests on a real local cluster (builds the cluster binaries once); K8S_VERSION=v1.X.Y for another release
	hack/test.sh e2e

.PHONY: lint
lint: ## gofmt, go vet, helm lint --strict
	hack/test.sh lint

.PHONY: bench
bench: ## benchmarks of the mutation, the handler and the probe (figures: docs/benchmarks.md)
	hack/bench.sh

.PHONY: loadtest
loadtest: ## side-by-side admission load through a real kube-apiserver (figures: docs/benchmarks.md); LOADTEST_FLAGS=-h for options
	hack/tools.sh all && go run ./hack/loadtest $(LOADTEST_FLAGS)

.PHONY: fuzz
fuzz: ## fuzz every parser of untrusted input for FUZZTIME each (30s, 10m or 10000000x; docs/reliability.md)
	hack/fuzz.sh

.PHONY: golden
golden: ## rewrite the golden files from the current mutation
	REFRESH_GOLDEN=true go test -count=1 ./webhook/inject/ ./nodeprobe/...

.PHONY: demo
demo: ## a local cluster with simulated GPU nodes, gpu-injector installed, classic workloads, and a report
	hack/demo.sh

.PHONY: tools
tools: ## build and cache etcd, Kubernetes, helm and NVIDIA's device plugin (e2e/cluster/versions.env) under ~/.cache/gpu-injector
	hack/tools.sh all
