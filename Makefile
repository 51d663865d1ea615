# restow's Makefile. Every tool the build and the tests need is built here from
# Go modules into ./bin: nothing is downloaded from anywhere but the Go module proxy.

# Kubernetes version of the test control plane (kube-apiserver and etcd built
# from source by hack/build-control-plane.sh).
K8S_VERSION ?= 1.37.1
# Older versions `make test-compat` also runs the integration suite against.
K8S_COMPAT_VERSIONS ?= 1.34.4 1.35.4 1.36.3

CONTROLLER_TOOLS_VERSION ?= v0.23.0
GOLANGCI_LINT_VERSION ?= v2.15.0
ACTIONLINT_VERSION ?= v1.7.12
# SBOMs of the binaries, from the Go module graph (make sbom, make sbom-dist).
CYCLONEDX_GOMOD_VERSION ?= v1.10.0
# The cosign the signing test runs (internal/supplychain), and the one the
# release workflow installs to sign a release (docs/release.md).
COSIGN_VERSION ?= v3.1.3
CRD_REF_DOCS_VERSION ?= v0.3.0
# Prometheus' module version v0.316.0 is Prometheus 3.x; its promtool runs
# the alert rules' unit tests (config.TestAlertRules).
PROMTOOL_VERSION ?= v0.316.0
# gotestsum runs go test for make test: a line per package with its time,
# the failures again at the end, and a JSON record of every test's time
# (make test-times).
GOTESTSUM_VERSION ?= v1.13.0

GOOS ?= $(shell go env GOOS)
GOARCH ?= $(shell go env GOARCH)
LOCALBIN ?= $(CURDIR)/bin
CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen-$(CONTROLLER_TOOLS_VERSION)
GOLANGCI_LINT ?= $(LOCALBIN)/golangci-lint-$(GOLANGCI_LINT_VERSION)
ACTIONLINT ?= $(LOCALBIN)/actionlint-$(ACTIONLINT_VERSION)
CYCLONEDX_GOMOD ?= $(LOCALBIN)/cyclonedx-gomod-$(CYCLONEDX_GOMOD_VERSION)
COSIGN ?= $(LOCALBIN)/cosign-$(COSIGN_VERSION)
CRD_REF_DOCS ?= $(LOCALBIN)/crd-ref-docs-$(CRD_REF_DOCS_VERSION)
PROMTOOL ?= $(LOCALBIN)/promtool-$(PROMTOOL_VERSION)
GOTESTSUM ?= $(LOCALBIN)/gotestsum-$(GOTESTSUM_VERSION)
envtest_assets = $(LOCALBIN)/k8s/$(1)-$(GOOS)-$(GOARCH)
ENVTEST_ASSETS ?= $(call envtest_assets,$(K8S_VERSION))

# Packages with tests: everything but e2e, which has its own build tag and target.
# Three packages at once: with two, a quarter of the two cores stayed idle.
GO_TEST_FLAGS ?= -race -count=1 -timeout 30m -p 3
# The one version string of a build: stamped into both binaries (--version,
# kubectl restow version, the restow_build_info metric) and into the image
# reference of the install manifests. A release sets it from its tag.
VERSION ?= $(shell git describe --tags --match 'v[0-9]*' --dirty 2>/dev/null || echo v0.1.0-dev)
IMAGE_REPO ?= ghcr.io/restow/restow
IMG ?= $(IMAGE_REPO):$(VERSION)
GIT_COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS ?= -s -w -X github.com/restow/restow/internal/version.Version=$(VERSION) -X github.com/restow/restow/internal/version.Commit=$(GIT_COMMIT)

# The Helm chart; its version is VERSION without the "v" (SemVer), its
# appVersion VERSION itself, so the default image tag is IMG's.
CHART_DIR ?= charts/restow
CHART_VERSION ?= $(patsubst v%,%,$(VERSION))

SHELL = /usr/bin/env bash -o pipefail
.SHELLFLAGS = -ec

.PHONY: all
all: build

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  %-18s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate the CRD and RBAC manifests into config/, and copy them into the Helm chart.
	$(CONTROLLER_GEN) rbac:roleName=manager-role crd paths="./..." output:crd:artifacts:config=config/crd/bases
	@# The chart templates these copies (charts/restow/templates/crds.yaml, rbac.yaml); make verify keeps them in step.
	cp config/crd/bases/migration.restow.dev_storagemigrations.yaml $(CHART_DIR)/files/
	cp config/rbac/role.yaml $(CHART_DIR)/files/manager-role.yaml
	cp config/components/prometheus-rules/prometheusrule.yaml $(CHART_DIR)/files/prometheusrule.yaml
	cp config/grafana/restow-dashboard.json $(CHART_DIR)/files/restow-dashboard.json

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate deepcopy code.
	$(CONTROLLER_GEN) object:headerFile="hack/boilerplate.go.txt" paths="./..."

# Configuration and templates in hack/api-docs; make verify keeps the page in step with the Go types.
.PHONY: api-docs
api-docs: $(CRD_REF_DOCS) ## Generate the API reference docs/api-reference.md from the Go types in api/.
	$(CRD_REF_DOCS) --source-path=./api --config=hack/api-docs/config.yaml --renderer=markdown \
	  --templates-dir=hack/api-docs/templates --output-path=docs/api-reference.md --log-level=WARN

# hack/clidocs; make verify keeps the pages in step with the commands.
.PHONY: cli-docs
cli-docs: ## Generate the CLI reference docs/reference/cli/ from kubectl-restow's commands.
	go run ./hack/clidocs --output docs/reference/cli

.PHONY: fmt
fmt: ## Run gofmt on the code.
	gofmt -s -w $$(git ls-files '*.go')

.PHONY: vet
vet: ## Run go vet.
	go vet ./...

.PHONY: lint
lint: $(GOLANGCI_LINT) lint-workflows ## Run golangci-lint and actionlint.
	$(GOLANGCI_LINT) run ./...

# The workflows run only on GitHub: this is the one check they get before.
.PHONY: lint-workflows
lint-workflows: $(ACTIONLINT) ## Check .github/workflows and the sample workflow of config/samples/ci with actionlint.
	$(ACTIONLINT)
	$(ACTIONLINT) config/samples/ci/*.yaml

.PHONY: verify
verify: generate manifests api-docs cli-docs ## Regenerate, check formatting and go.mod, fail on any difference from git.
	@unformatted=$$(gofmt -s -l $$(git ls-files '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt -s would change:"; echo "$$unformatted"; exit 1; fi
	go mod tidy
	cd hack/controlplane && go mod tidy
	cd hack/fluxcontroller && go mod tidy
	@if [ -n "$$(git status --porcelain)" ]; then \
	  echo "The tree is not clean after regenerating (run make generate manifests api-docs cli-docs and go mod tidy, then commit):"; \
	  git status --porcelain; git --no-pager diff --stat; exit 1; fi

##@ Test

.PHONY: envtest-assets
envtest-assets: ## Build kube-apiserver and etcd from source for K8S_VERSION (idempotent) and print their directory.
	@hack/build-control-plane.sh $(K8S_VERSION) $(ENVTEST_ASSETS) >&2
	@echo $(ENVTEST_ASSETS)

.PHONY: test
test: ## Run unit and integration tests (real API server and etcd) with -race, then the e2e suite.
	@# A new make test starts here: an earlier run's times are not mixed in.
	@mkdir -p $(TEST_REPORTS) && rm -f $(TEST_REPORTS)/*.json
	@# One after the other: the machine's two cores are busy through the
	@# integration tests, and e2e tests beside them starved (a pass made no
	@# progress for minutes; docs/development.md).
	$(MAKE) --no-print-directory test-integration
	$(MAKE) --no-print-directory test-e2e

# The integration packages, the longest first: go test starts packages in
# the order given, so that the longest does not start last and end the run
# alone (docs/development.md, "How long the tests take").
SLOW_TEST_PACKAGES := controllers internal/hatest/knowing internal/cli config internal/hatest/bound internal/operator internal/migrator internal/imagetar
MODULE := $(shell go list -m)
TEST_PACKAGES = $(addprefix ./,$(SLOW_TEST_PACKAGES)) $(filter-out $(addprefix $(MODULE)/,$(SLOW_TEST_PACKAGES)),$(shell go list ./...))

.PHONY: test-integration
test-integration: envtest-assets $(PROMTOOL) $(GOTESTSUM) ## Run unit and integration tests (real API server and etcd) only.
	KUBEBUILDER_ASSETS=$(ENVTEST_ASSETS) PROMTOOL=$(PROMTOOL) $(GOTESTSUM) --format pkgname \
	  --jsonfile-timing-events $(TEST_REPORTS)/integration.json -- $(GO_TEST_FLAGS) $(TEST_PACKAGES)

# The manager binary the tests run as a process (internal/operator.Build),
# built once here rather than by each of the ten test packages that start it.
TEST_MANAGER ?= $(LOCALBIN)/test-manager
.PHONY: test-manager
test-manager:
	go build -trimpath -o $(TEST_MANAGER) ./cmd/manager
test-integration test-e2e: test-manager
test-integration test-e2e: export RESTOW_MANAGER_BINARY := $(TEST_MANAGER)

# The Go garbage collector's target for the tests' processes: the test
# binaries and the kube-apiservers and etcds they start, whose collector
# took about a fifth of an API server's CPU at Go's default of 100. The
# manager's process keeps Go's default (operator.StartProcess), since tests
# measure its memory; make bench sets nothing.
TEST_GOGC ?= 300
test-integration test-e2e test-long test-gitops: export GOGC := $(TEST_GOGC)

# The SBOM and signing tests (internal/supplychain) run the Makefile's own
# cyclonedx-gomod and cosign, which they find in these variables.
test-integration: $(CYCLONEDX_GOMOD) $(COSIGN)
test-integration: export CYCLONEDX_GOMOD := $(CYCLONEDX_GOMOD)
test-integration: export COSIGN := $(COSIGN)

# Object counts and where the figures, tables and plots go (docs/bench/).
RESTOW_BENCH_SIZES ?= 1000,10000,50000
RESTOW_BENCH_OUT ?= $(CURDIR)/docs/bench
BENCH_FLAGS ?= -benchtime 1x -timeout 3h

# Three packages at once: an e2e test mostly waits (for a manager, a lag, a
# settle window), so two left the cores idle a third of the time.
E2E_FLAGS ?= -count=1 -timeout 40m -v -p 3

.PHONY: test-e2e
test-e2e: envtest-assets $(GOTESTSUM) ## Run the end-to-end suite: the manager binary as a process against the control plane, faults injected.
	@mkdir -p $(TEST_REPORTS)
	KUBEBUILDER_ASSETS=$(ENVTEST_ASSETS) $(GOTESTSUM) --format standard-verbose \
	  --jsonfile-timing-events $(TEST_REPORTS)/e2e.json -- -tags e2e $(E2E_FLAGS) ./e2e/...

# The long tests: CRD upgrades at a release's scale, each case minutes of
# real time at the deploy tools' own settings (2,000 objects a CRD, the
# hooks' two-minute settle windows, real projects' releases, etcd's quota
# filled and compacted), in files built with the tag long. make test leaves
# them out, to stay within 40 minutes on two cores; run make test-long once
# per change to what they cover, and report it (docs/development.md).
LONG_TEST_PACKAGES := ./internal/cli ./config
LONG_E2E_PACKAGES := ./e2e/space/... ./e2e/chart/... ./e2e/releases/...
LONG_TESTS = $(shell grep -l '^//go:build long' $(addsuffix /*_test.go,$(LONG_TEST_PACKAGES)) | xargs grep -ho '^func Test[A-Za-z0-9_]*' | sed 's/^func //' | paste -sd'|')

.PHONY: test-long
test-long: envtest-assets test-manager $(GOTESTSUM) ## Run the long tests: prepare, bridges and Helm hooks at 2,000 objects, a chart of ten CRDs, real releases, etcd's quota.
	@mkdir -p $(TEST_REPORTS)
	KUBEBUILDER_ASSETS=$(ENVTEST_ASSETS) RESTOW_MANAGER_BINARY=$(TEST_MANAGER) $(GOTESTSUM) --format pkgname \
	  --jsonfile-timing-events $(TEST_REPORTS)/long.json -- -tags long $(GO_TEST_FLAGS) -run '^($(LONG_TESTS))$$' $(LONG_TEST_PACKAGES)
	KUBEBUILDER_ASSETS=$(ENVTEST_ASSETS) RESTOW_MANAGER_BINARY=$(TEST_MANAGER) $(GOTESTSUM) --format standard-verbose \
	  --jsonfile-timing-events $(TEST_REPORTS)/long-e2e.json -- -tags e2e,long $(E2E_FLAGS) $(LONG_E2E_PACKAGES)

# Flux's kustomize-controller, built from its Go module (hack/fluxcontroller)
# for make test-gitops only: its build takes minutes the CI run does not
# have, so that target runs once per change to what it covers, and is
# reported (docs/development.md).
KUSTOMIZE_CONTROLLER_VERSION ?= $(shell cd hack/fluxcontroller && go list -m -f '{{.Version}}' github.com/fluxcd/kustomize-controller)
KUSTOMIZE_CONTROLLER ?= $(LOCALBIN)/kustomize-controller-$(KUSTOMIZE_CONTROLLER_VERSION)
$(KUSTOMIZE_CONTROLLER):
	@mkdir -p $(LOCALBIN)
	cd hack/fluxcontroller && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o $@.tmp github.com/fluxcd/kustomize-controller
	mv $@.tmp $@

.PHONY: test-gitops
test-gitops: envtest-assets test-manager $(KUSTOMIZE_CONTROLLER) $(GOTESTSUM) ## Run the GitOps suite: Flux's kustomize-controller (built from source) applying releases beside restow.
	KUBEBUILDER_ASSETS=$(ENVTEST_ASSETS) RESTOW_MANAGER_BINARY=$(TEST_MANAGER) RESTOW_KUSTOMIZE_CONTROLLER=$(KUSTOMIZE_CONTROLLER) \
	  RESTOW_KUSTOMIZE_CRDS=$$(cd hack/fluxcontroller && go list -m -f '{{.Dir}}' github.com/fluxcd/kustomize-controller)/config/crd/bases \
	  $(GOTESTSUM) --format standard-verbose -- -tags e2e,gitops -count=1 -timeout 30m -v ./e2e/gitops/...

# Where make test-integration and make test-e2e record every test's time.
TEST_REPORTS ?= $(LOCALBIN)/test-reports

.PHONY: test-times
test-times: $(GOTESTSUM) ## Print the ten slowest tests of the last make test (docs/development.md keeps this list).
	@reports="$(wildcard $(TEST_REPORTS)/integration.json $(TEST_REPORTS)/e2e.json)"; \
	  if [ -z "$$reports" ]; then echo "No test times in $(TEST_REPORTS): run make test first." >&2; exit 1; fi; \
	  cat $$reports | $(GOTESTSUM) tool slowest --num 10

.PHONY: bench
bench: envtest-assets ## Run the benchmarks on the source-built control plane, writing docs/bench/ with CPU profiles (about 90 minutes).
	KUBEBUILDER_ASSETS=$(ENVTEST_ASSETS) RESTOW_BENCH_SIZES=$(RESTOW_BENCH_SIZES) RESTOW_BENCH_OUT=$(RESTOW_BENCH_OUT) \
	  RESTOW_BENCH_PROFILE=$(RESTOW_BENCH_OUT)/profiles \
	  go test -run '^$$' -bench . $(BENCH_FLAGS) -count 1 ./internal/migrator/bench/

# The defaults' cost: the manager process, started right after the storage
# switch, with its default flags and with --auto-migrate-builtins=false,
# against the fastest bare loops, interleaved (5 rounds at 10,000 objects,
# one at 50,000); it prints each row's median against the fastest loop's.
.PHONY: bench-defaults
bench-defaults: envtest-assets test-manager ## Time the manager with its defaults against the trigger of built-ins off and the bare loops, writing docs/bench/defaults/.
	KUBEBUILDER_ASSETS=$(ENVTEST_ASSETS) RESTOW_BENCH_OUT=$(RESTOW_BENCH_OUT)/defaults RESTOW_MANAGER_BINARY=$(TEST_MANAGER) \
	  go test -run '^$$' -bench BenchmarkDefaults $(BENCH_FLAGS) -count 1 ./internal/migrator/bench/

# What restow's repeated reads cost (requests and bytes per period, on three
# API servers), and how soon the manager migrates behind an API server whose
# watch lags RESTOW_BENCH_LAG (90 s by default).
.PHONY: bench-background
bench-background: envtest-assets test-manager ## Measure the cost of each periodic read and the reaction behind a lagging API server.
	KUBEBUILDER_ASSETS=$(ENVTEST_ASSETS) RESTOW_MANAGER_BINARY=$(TEST_MANAGER) \
	  go test -run '^$$' -bench 'BenchmarkPeriodicReads|BenchmarkReactionBehindLag' $(BENCH_FLAGS) -count 1 ./internal/migrator/bench/

# The scale point: the manager as deployed (default settle window) over
# 200,000 objects, for its memory and status writes (about 28 minutes).
RESTOW_BENCH_SCALE ?= 200000

.PHONY: bench-scale
bench-scale: envtest-assets ## Run the manager over RESTOW_BENCH_SCALE objects once, writing docs/bench/scale/.
	KUBEBUILDER_ASSETS=$(ENVTEST_ASSETS) RESTOW_BENCH_SIZES=$(RESTOW_BENCH_SCALE) RESTOW_BENCH_OUT=$(RESTOW_BENCH_OUT)/scale \
	  go test -run '^$$' -bench BenchmarkCompare $(BENCH_FLAGS) -count 1 ./internal/migrator/bench/

# kubectl restow verify's read of etcd at RESTOW_VERIFY_BENCH_SIZES objects
# (10,000 and 200,000 by default; 33 s once built, `time make bench-verify`
# on 2026-11-26).
RESTOW_VERIFY_BENCH_SIZES ?= 10000,200000

.PHONY: bench-verify
bench-verify: envtest-assets ## Time kubectl restow verify's etcd read and its peak heap at RESTOW_VERIFY_BENCH_SIZES objects.
	KUBEBUILDER_ASSETS=$(ENVTEST_ASSETS) RESTOW_VERIFY_BENCH_SIZES=$(RESTOW_VERIFY_BENCH_SIZES) \
	  go test -run '^$$' -bench BenchmarkScan -benchtime 3x -count 1 -timeout 30m ./internal/verify/

# The compat runs check the API server's behaviour, not data races: make
# test covers those on K8S_VERSION, and -race would double each run.
COMPAT_TEST_FLAGS ?= -count=1 -timeout 30m

.PHONY: test-compat
test-compat: ## Run the unit and integration tests against every K8S_COMPAT_VERSIONS control plane (not in CI; docs/install.md).
	@for v in $(K8S_COMPAT_VERSIONS); do \
	  echo "=== Kubernetes $$v"; \
	  start=$$SECONDS; \
	  $(MAKE) --no-print-directory test-integration K8S_VERSION=$$v GO_TEST_FLAGS="$(COMPAT_TEST_FLAGS)" || exit 1; \
	  echo "=== Kubernetes $$v: passed in $$((SECONDS - start))s"; \
	done

##@ Build

.PHONY: build
build: ## Build the manager and the kubectl plugin into bin/.
	go build -trimpath -ldflags "$(LDFLAGS)" -o $(LOCALBIN)/manager ./cmd/manager
	go build -trimpath -ldflags "$(LDFLAGS)" -o $(LOCALBIN)/kubectl-restow ./cmd/kubectl-restow

.PHONY: build-installer
build-installer: manifests ## Write dist/install.yaml: config/default in one file, the manager's image pinned to IMG.
	go run ./hack/installer --kustomization config/default --image $(IMG) --version $(VERSION) --output dist/install.yaml

.PHONY: set-version
set-version: ## Name VERSION as the release in config/manager (the release commit; see docs/release.md).
	sed -i.bak -E 's/^(  newTag: ).*/\1$(VERSION)/' config/manager/kustomization.yaml && rm -f config/manager/kustomization.yaml.bak

.PHONY: demo
demo: envtest-assets ## Run the demo on a throw-away control plane it starts itself (no cluster needed).
	KUBEBUILDER_ASSETS=$(ENVTEST_ASSETS) go run ./cmd/demo $(DEMO_ARGS)

.PHONY: run
run: ## Run the manager against the cluster in KUBECONFIG.
	go run ./cmd/manager --log-encoding=console

.PHONY: docker-build
docker-build: ## Build the container image (needs a Docker engine).
	docker build --build-arg VERSION=$(VERSION) --build-arg GIT_COMMIT=$(GIT_COMMIT) -t $(IMG) .

IMAGE_TAR ?= $(LOCALBIN)/restow-image.tar
IMAGE_ARCH ?= $(GOARCH)

.PHONY: image-tar
image-tar: ## Assemble the manager's image (with the kubectl plugin, for helm test) as an OCI archive without a container engine (bin/restow-image.tar).
	CGO_ENABLED=0 GOOS=linux GOARCH=$(IMAGE_ARCH) go build -trimpath -ldflags "$(LDFLAGS)" -o $(LOCALBIN)/linux-$(IMAGE_ARCH)/manager ./cmd/manager
	CGO_ENABLED=0 GOOS=linux GOARCH=$(IMAGE_ARCH) go build -trimpath -ldflags "$(LDFLAGS)" -o $(LOCALBIN)/linux-$(IMAGE_ARCH)/kubectl-restow ./cmd/kubectl-restow
	go run ./hack/imagetar --binary $(LOCALBIN)/linux-$(IMAGE_ARCH)/manager --plugin $(LOCALBIN)/linux-$(IMAGE_ARCH)/kubectl-restow --arch $(IMAGE_ARCH) --version $(VERSION) --ref $(IMG) --output $(IMAGE_TAR)

.PHONY: chart
chart: manifests ## Package the Helm chart into dist/restow-<chart version>.tgz: version and appVersion from VERSION, image.repository from IMAGE_REPO.
	go run ./hack/helmpackage --chart $(CHART_DIR) --version $(CHART_VERSION) --app-version $(VERSION) --image-repository $(IMAGE_REPO) --output dist

# Platforms the kubectl plugin is released for (make dist; krew picks one by os/arch).
DIST_PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 windows/amd64 windows/arm64

# Earlier runs' archives are removed first: they would otherwise end up in
# checksums.txt and the manifest under this VERSION's name.
.PHONY: dist
dist: ## Cross-build kubectl-restow for DIST_PLATFORMS: dist/ archives, checksums.txt and the krew manifest dist/plugins/restow.yaml.
	rm -rf dist/bin dist/plugins dist/checksums.txt dist/kubectl-restow_*
	for platform in $(DIST_PLATFORMS); do \
	  os=$${platform%/*}; arch=$${platform#*/}; exe=; if [ "$$os" = windows ]; then exe=.exe; fi; \
	  echo "kubectl-restow $(VERSION) for $$os/$$arch"; \
	  CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch go build -trimpath -ldflags "$(LDFLAGS)" \
	    -o dist/bin/$${os}_$${arch}/kubectl-restow$$exe ./cmd/kubectl-restow; \
	done
	go run ./hack/krew --version $(VERSION) --binaries dist/bin --license LICENSE --dist dist

# SBOMs: CycloneDX JSON from the Go module graph as it is for one platform
# (GOOS, GOARCH; cgo off, as in every release build), with the licenses
# found in the modules' sources. No timestamp or serial number: one commit
# gives the same files, as it gives the same archives.
CYCLONEDX_GOMOD_FLAGS ?= -json -licenses -notimestamp -noserial
SBOM_DIR ?= $(LOCALBIN)/sbom

.PHONY: sbom
sbom: $(CYCLONEDX_GOMOD) ## Write CycloneDX SBOMs of the manager and the kubectl plugin for GOOS/GOARCH into SBOM_DIR (bin/sbom/<binary>.cdx.json).
	mkdir -p $(SBOM_DIR)
	for main in manager kubectl-restow; do \
	  CGO_ENABLED=0 GOOS=$(GOOS) GOARCH=$(GOARCH) $(CYCLONEDX_GOMOD) app $(CYCLONEDX_GOMOD_FLAGS) \
	    -main cmd/$$main -output $(SBOM_DIR)/$$main.cdx.json; \
	done

# After make dist, which removes earlier runs' SBOMs with its archives.
.PHONY: sbom-dist
sbom-dist: $(CYCLONEDX_GOMOD) ## Write the SBOM of each make dist archive: dist/kubectl-restow_<version>_<os>_<arch>.cdx.json.
	for platform in $(DIST_PLATFORMS); do \
	  os=$${platform%/*}; arch=$${platform#*/}; \
	  CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(CYCLONEDX_GOMOD) app $(CYCLONEDX_GOMOD_FLAGS) \
	    -main cmd/kubectl-restow -output dist/kubectl-restow_$(VERSION)_$${os}_$${arch}.cdx.json; \
	done

##@ Tools

$(LOCALBIN):
	mkdir -p $(LOCALBIN)

$(GOTESTSUM): | $(LOCALBIN)
	GOBIN=$(LOCALBIN) go install gotest.tools/gotestsum@$(GOTESTSUM_VERSION)
	mv $(LOCALBIN)/gotestsum $@

$(CONTROLLER_GEN): | $(LOCALBIN)
	GOBIN=$(LOCALBIN) go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS_VERSION)
	mv $(LOCALBIN)/controller-gen $@

$(GOLANGCI_LINT): | $(LOCALBIN)
	GOBIN=$(LOCALBIN) go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(LOCALBIN)/golangci-lint $@

$(ACTIONLINT): | $(LOCALBIN)
	GOBIN=$(LOCALBIN) go install github.com/rhysd/actionlint/cmd/actionlint@$(ACTIONLINT_VERSION)
	mv $(LOCALBIN)/actionlint $@

$(CYCLONEDX_GOMOD): | $(LOCALBIN)
	GOBIN=$(LOCALBIN) go install github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@$(CYCLONEDX_GOMOD_VERSION)
	mv $(LOCALBIN)/cyclonedx-gomod $@

# About five minutes on 2 cores with a cold build cache.
$(COSIGN): | $(LOCALBIN)
	GOBIN=$(LOCALBIN) go install github.com/sigstore/cosign/v3/cmd/cosign@$(COSIGN_VERSION)
	mv $(LOCALBIN)/cosign $@

$(CRD_REF_DOCS): | $(LOCALBIN)
	GOBIN=$(LOCALBIN) go install github.com/elastic/crd-ref-docs@$(CRD_REF_DOCS_VERSION)
	mv $(LOCALBIN)/crd-ref-docs $@

$(PROMTOOL): | $(LOCALBIN)
	GOBIN=$(LOCALBIN) go install github.com/prometheus/prometheus/cmd/promtool@$(PROMTOOL_VERSION)
	mv $(LOCALBIN)/promtool $@
