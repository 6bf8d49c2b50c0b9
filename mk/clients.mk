##@ Clients
# The Python, Node and Rust libraries, the Lua script they share, and the examples built on them.

.PHONY: deps-clients test-clients test-clients-python test-clients-node test-clients-rust \
	test-clients-cluster examples python-rl dist-python dist-rust

# redis-py, for the Python library's tests, its benchmark and the examples: one pip --target
# install (fine on an externally managed python3), put on PYTHONPATH by whoever needs it.
PYTHON_DEPS := $(CURDIR)/target/python-deps
REDIS_PY := $(PYTHON_DEPS)/redis/__init__.py
# The redis_rl library as `pip install ./clients/python` builds it (the tests and examples use
# the installed package, not the source tree), and the path that finds it and redis-py.
PYTHON_RL := $(CURDIR)/target/python-rl
PYTHON_PATH := $(PYTHON_RL):$(PYTHON_DEPS)

$(REDIS_PY):
	python3 -m pip install --quiet --upgrade --target "$(PYTHON_DEPS)" -r examples/python/requirements.txt

# redis-py 5.x, the oldest the library supports (pip picks 8.x for `redis>=5,<9`), in a
# --target directory of its own: tests/test_busy.py runs itself again on it.
PYTHON_DEPS_REDIS5 := $(CURDIR)/target/python-deps-redis5
REDIS_PY5 := $(PYTHON_DEPS_REDIS5)/redis/__init__.py

$(REDIS_PY5):
	python3 -m pip install --quiet --upgrade --target "$(PYTHON_DEPS_REDIS5)" "redis>=5,<6"

# The web frameworks the HTTP middleware tests run in (redis_rl.asgi, redis_rl.wsgi), into the
# same --target directory.
PYTHON_HTTP := $(PYTHON_DEPS)/fastapi/__init__.py

$(PYTHON_HTTP): $(REDIS_PY)
	python3 -m pip install --quiet --upgrade --target "$(PYTHON_DEPS)" starlette fastapi httpx flask

# Django, for redis_rl.django's tests, into the same directory (its own stamp, so a directory
# made before Django was added gets it too).
PYTHON_DJANGO := $(PYTHON_DEPS)/django/__init__.py

$(PYTHON_DJANGO): $(REDIS_PY)
	python3 -m pip install --quiet --upgrade --target "$(PYTHON_DEPS)" django

# PyPA's `build`, for the wheel and sdist of dist-python, in a --target directory of its own.
PYTHON_BUILD := $(CURDIR)/target/python-build
PYTHON_BUILD_TOOL := $(PYTHON_BUILD)/build/__init__.py

$(PYTHON_BUILD_TOOL):
	python3 -m pip install --quiet --upgrade --target "$(PYTHON_BUILD)" build

# mypy, for the type check of examples/python against the library's annotations (--strict),
# in a --target directory of its own.
PYTHON_MYPY := $(CURDIR)/target/python-mypy
PYTHON_MYPY_TOOL := $(PYTHON_MYPY)/mypy/__init__.py

$(PYTHON_MYPY_TOOL):
	python3 -m pip install --quiet --upgrade --target "$(PYTHON_MYPY)" mypy

# Reinstalled on every run: pip decides nothing from timestamps, and it takes a second.
python-rl:
	python3 -m pip install --quiet --no-deps --upgrade --target "$(PYTHON_RL)" ./clients/python

deps-clients: deps $(REDIS_PY) $(PYTHON_HTTP) $(PYTHON_DJANGO) ## Install what the client libraries' tests need: redis-py and the web frameworks (pip), the Node packages (npm)
	@command -v npm >/dev/null || { echo "deps-clients: npm not found; install Node.js 18+ and npm"; exit 1; }
	cd clients/node && npm install --no-audit --no-fund --loglevel=error

test-clients: test-clients-python test-clients-node test-clients-rust test-clients-cluster ## Test the Python, Node and Rust libraries and the Lua script against real servers and a cluster

test-clients-python: deps-clients $(REDIS_PY5) $(PYTHON_MYPY_TOOL) $(MODULE_DEBUG) python-rl ## The Python library: vectors, Lua script, module, Functions library, plain server, permissions, misconfigurations, outages, busy pools (redis-py 8.x and 5.x), shield, mypy --strict on examples/python
	python3 clients/vectors/generate.py --check
	python3 clients/vectors/table_generate.py --check
	python3 clients/vectors/lease_generate.py --check
	PYTHONPATH="$(PYTHON_PATH)" RL_REDIS_PY5="$(PYTHON_DEPS_REDIS5)" python3 clients/python/tests/run.py
	PYTHONPATH="$(PYTHON_MYPY):$(PYTHON_PATH)" python3 -m mypy --strict --cache-dir target/mypy-cache examples/python
	$(MAKE) --no-print-directory dist-python

dist-python: deps $(PYTHON_BUILD_TOOL) $(MODULE_DEBUG) ## The Python package as users install it: wheel and sdist (python -m build in target/python-dist/), each and a copy of clients/python installed into a fresh venv outside the repository, and a smoke run there against servers with and without the module, plus examples/python's tests (wheel, sdist)
	PYTHONPATH="$(PYTHON_BUILD)" python3 clients/python/tests/dist_check.py target/python-dist

test-clients-node: deps-clients $(MODULE_DEBUG) ## The Node library: vectors, Lua script, module, plain server, outages, shield (ioredis and node-redis), and its npm pack installed outside the repository
	cd clients/node && npm test
	@# As users install it: the packed tarball and ioredis in a fresh temp dir, a smoke script
	@# against a server with the module and a plain one (the shipped Lua script).
	cd clients/node && npm run --silent test:pack

test-clients-rust: $(MODULE_DEBUG) ## The Rust client (clients/rust): vectors, module, plain server (Lua), outages, shield, cluster, wait, tower layer; then make dist-rust
	$(CARGO) test -p rl-bucket --test vectors --test lease_vectors
	$(CARGO) test -p redis-rl-client --features tower
	@# The client must not pull in the module's build dependencies. `-e normal`: the tree it
	@# ships with, not what its tests build (the shared harness, rl-testkit).
	@if $(CARGO) tree -p redis-rl-client -e normal | grep -i -E 'redis-module|bindgen|clang'; then \
		echo "test-clients-rust: redis-rl-client depends on the module's build (see above)"; exit 1; fi
	@# Nor HTTP crates for users who did not ask for the tower feature.
	@if $(CARGO) tree -p redis-rl-client -e normal | grep -E ' (tower|http|axum) v'; then \
		echo "test-clients-rust: redis-rl-client pulls in HTTP crates without the tower feature"; exit 1; fi
	$(MAKE) --no-print-directory dist-rust

dist-rust: deps $(MODULE_DEBUG) ## The Rust client as users get it: cargo package of it and rl-bucket, unpacked into a clean directory outside the repository, a program built there against them, run against servers with and without the module; the packaged example and the axum example app (its tests) built there and run too
	CARGO="$(CARGO)" MODULE="$(MODULE_DEBUG)" REDIS_SERVER="$(REDIS_SERVER)" clients/rust/dist/check.sh

test-clients-cluster: deps-clients $(MODULE_DEBUG) python-rl ## Both libraries on the `make cluster` cluster (started here on CLUSTER_PORT, and stopped, unless one runs)
	@# On a shared machine a port block can be taken meanwhile: try two more blocks after it.
	@port="$${CLUSTER_PORT:-30001}"; started=""; \
	if [ ! -d .run/cluster ]; then \
		for try in 1 2 3; do \
			if MODULE="$(MODULE_DEBUG)" REDIS_SERVER="$(REDIS_SERVER)" CLUSTER_PORT="$$port" \
				scripts/cluster.sh start >/dev/null; then started=1; break; fi; \
			port=$$((port + 1000)); \
		done; \
		[ -n "$$started" ] || { echo "test-clients-cluster: could not start a cluster"; exit 1; }; \
	else echo "test-clients-cluster: using the running cluster on 127.0.0.1:$$port"; fi; \
	status=0; \
	(cd clients/python/tests && RL_CLUSTER="127.0.0.1:$$port" PYTHONPATH="$(PYTHON_PATH)" python3 -m unittest -v test_cluster test_table_cluster) \
		|| status=1; \
	(cd clients/node && RL_CLUSTER="127.0.0.1:$$port" node --test test/cluster.test.js test/table-cluster.test.js) || status=1; \
	if [ -n "$$started" ]; then REDIS_SERVER="$(REDIS_SERVER)" scripts/cluster.sh stop >/dev/null; fi; \
	exit $$status

examples: deps $(MODULE_DEBUG) $(REDIS_PY) python-rl ## Test the Python, Node and Rust examples (apps on the client libraries) against a server with the module
	@command -v npm >/dev/null || { echo "examples: npm not found; install Node.js 18+ and npm"; exit 1; }
	cd examples/node && npm ci --no-audit --no-fund --loglevel=error
	PYTHONPATH="$(PYTHON_PATH)" RL_MODULE="$(MODULE_DEBUG)" REDIS_SERVER="$(REDIS_SERVER)" examples/run.sh
