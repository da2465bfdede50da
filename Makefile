# aws-ccm: everything CI runs is `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c

# Reuse a warm target dir outside the checkout: a cold build of the AWS SDK
# crates takes minutes, a warm one seconds.
CARGO_TARGET_DIR ?= $(HOME)/.cache/aws-ccm/target
export CARGO_TARGET_DIR
VENV := $(CURDIR)/.venv
export MOTO_SERVER := $(VENV)/bin/moto_server
NEXTEST_PROFILE := $(if $(CI),ci,default)

.PHONY: all build release release-ecr tools lint audit test unit sandbox bench bench-client bench-ecr chaos image e2e clean

all: build

build:
	cargo build --locked --bins

## release: the optimised binary, exactly as the Dockerfile builds it
release:
	cargo build --release --locked --bin aws-cloud-controller-manager

## release-ecr: the kubelet's ecr-credential-provider, optimised, as the Dockerfile builds it
release-ecr:
	cargo build --release --locked -p ecr-credential-provider --bin ecr-credential-provider

## tools: project-local virtualenv with moto and the linters (idempotent)
tools:
	scripts/install-moto.sh
	scripts/install-tools.sh

## lint: formatting, clippy, shell scripts, YAML, manifests, IAM policy, sizes of functions and files, owners' fields, dependencies (cargo deny)
lint: tools
	cargo fmt --check
	cargo clippy --locked --all-targets -- -D warnings
	$(VENV)/bin/shellcheck scripts/*.sh e2e/*.sh iam/*.sh .ci/run
	$(VENV)/bin/yamllint --strict .
	scripts/check-manifests.sh
	scripts/check-chart.sh
	scripts/check-kops.sh
	scripts/check-e2e.sh
	scripts/check-kubeadm.sh
	PARLIAMENT=$(VENV)/bin/parliament iam/lint.sh
	$(VENV)/bin/python iam/gen-authorization.py --check
	$(VENV)/bin/python crates/ccm-testkit/src/apiserver/openapi/gen-openapi.py --check
	scripts/check-dockerfile.sh
	scripts/check-doc-paths.sh
	scripts/check-readme-picture.sh
	$(VENV)/bin/python scripts/gen-compatibility-names.py --check
	scripts/check-observability.sh
	$(VENV)/bin/python scripts/check-sizes.py
	python3 scripts/check-owners.py
	python3 scripts/test_check_owners.py
	python3 scripts/check-orphan-audit.py
	$(VENV)/bin/python scripts/test_bench_table.py
	$(VENV)/bin/python scripts/test_product_lines.py
	scripts/check-deps.sh

## audit: cargo deny's advisory check (needs the RustSec database from GitHub)
audit:
	scripts/check-deps.sh advisories

# The AWS actions the CCM sent during the suite, for the IAM coverage test,
# and its Kubernetes requests, for the RBAC coverage test.
RECORD_DIR := $(CARGO_TARGET_DIR)/aws-actions
KUBE_RECORD_DIR := $(CARGO_TARGET_DIR)/kube-requests
RECORD_ENV := AWS_CCM_RECORD_ACTIONS=$(RECORD_DIR) AWS_CCM_RECORD_KUBE_REQUESTS=$(KUBE_RECORD_DIR)

# The integration tests mostly wait (on moto, the API test server, the CCM's
# timers): three per core on 2 cores took the suite from 324 s (4 threads) to
# 245 s for 13 % more test time (CONTRIBUTING.md).
TEST_THREADS ?= $(shell echo $$(( $$(nproc) * 3 )))

## test: everything CI runs; the IAM and RBAC coverage tests run last, on what the suite recorded,
## then the check that `make sandbox` would compile no dependency again
test: lint unit
	rm -rf $(RECORD_DIR) $(KUBE_RECORD_DIR) && mkdir -p $(RECORD_DIR) $(KUBE_RECORD_DIR)
	$(RECORD_ENV) cargo nextest run --locked --profile $(NEXTEST_PROFILE) --no-tests=pass \
	  --test-threads $(TEST_THREADS)
	mv target/nextest/$(NEXTEST_PROFILE)/junit.xml target/nextest/$(NEXTEST_PROFILE)/suite.xml
	python3 scripts/slowest-tests.py target/nextest/$(NEXTEST_PROFILE)/suite.xml
	$(RECORD_ENV) cargo nextest run --locked --profile $(NEXTEST_PROFILE) \
	  --ignore-default-filter -E 'binary(iam_policy) & test(recorded_requests_are_allowed)'
	$(RECORD_ENV) cargo nextest run --locked --profile $(NEXTEST_PROFILE) \
	  --ignore-default-filter -E 'binary(rbac_policy) & test(recorded_requests_are_allowed)'
	scripts/check-one-build.sh

## unit: the library tests; none may start moto, the API test server or the fault proxy
## (AWS_CCM_NO_SERVERS makes them refuse): a test that needs one lives under its crate's tests/
unit:
	AWS_CCM_NO_SERVERS=1 cargo nextest run --locked --lib --no-tests=pass

## sandbox: moto behind the fault proxy + API test server + the CCM in the foreground (no Docker needed)
sandbox: tools build
	scripts/sandbox.sh

## bench: scale benchmark of the release binary; prints one table (not part of CI).
## SCALE_SCENARIOS / SCALE_NODES / ... pick and size it (see crates/aws-ccm/benches/scale.rs).
bench: tools
	cargo bench --locked --bench scale

## chaos: the reliability campaigns at full size, three at a time; prints one
## table of their figures (not part of CI; `make test` runs the short versions).
## CHAOS_SEED=<n> replays a run.
CHAOS_DIR := $(CARGO_TARGET_DIR)/chaos
chaos: tools
	rm -rf $(CHAOS_DIR) && mkdir -p $(CHAOS_DIR)
	status=0; CHAOS=full CHAOS_FIGURES=$(CHAOS_DIR) cargo nextest run --locked --profile chaos \
	  -p aws-ccm --test ccm -E 'test(/^chaos::/)' --no-fail-fast || status=$$?; \
	$(VENV)/bin/python scripts/chaos-table.py $(CHAOS_DIR) && exit $$status

## bench-ecr: start-to-answer time of the release ecr-credential-provider against moto and its
## size; prints figures (not part of CI). The harness runs in the dev profile so the test tools
## are not rebuilt with LTO; ECR_BENCH_RUNS sets the runs per case.
bench-ecr: tools release-ecr
	ECR_BENCH_BINARY=$(CARGO_TARGET_DIR)/release/ecr-credential-provider \
	  cargo bench --locked --profile dev -p ecr-credential-provider --bench startup

## bench-client: figures of the AWS client layer alone (coalescing, limiter, throttling)
bench-client: tools
	cargo bench --locked --bench aws_client

## image: container image (needs a Docker engine)
image:
	docker build -t aws-cloud-controller-manager:dev .

## e2e: kind + AWS emulator end-to-end (needs Docker)
e2e:
	e2e/run.sh

clean:
	cargo clean
	rm -rf $(VENV) .sandbox
