##@ Release
# The tarball: built for glibc 2.17 and checked on the oldest and newest servers.

.PHONY: dist dist-check

dist: deps ## Release tarball in target/dist/: the .so linked for glibc 2.17 (cargo-zigbuild), docs, SHA256SUMS
	scripts/dist.sh build

dist-check: servers ## Check the tarball: SHA256SUMS, no symbol past GLIBC_2.17 (objdump -T), the suite with its .so on Redis 7.0 and Valkey 9 (DIST_CHECK_SERVERS= names others)
	$(CARGO) test --test '*' --no-run
	scripts/dist.sh check

# The previous release (the commit of its version bump), built apart in target/previous/
# from `git archive`, for the rollback check: this release's files, tables unlinked, load
# there (tests/rollback.rs; docs/operations.md, Rolling back).
PREVIOUS_RELEASE ?= fd1bab55071934d1691f8d93482a51c75669d56a
PREVIOUS_MODULE := $(CURDIR)/target/previous/release/libredis_rl.so

.PHONY: test-rollback
test-rollback: $(MODULE_DEBUG) ## Build the previous release (PREVIOUS_RELEASE=, 0.2.0) from git and check this release's files load there once tables are gone
	rm -rf target/previous-src && mkdir -p target/previous-src
	git archive $(PREVIOUS_RELEASE) | tar -x -C target/previous-src
	cd target/previous-src && CARGO_TARGET_DIR=$(CURDIR)/target/previous $(CARGO) build --release --lib
	RL_PREVIOUS_MODULE=$(PREVIOUS_MODULE) $(CARGO) test --test rollback -- --nocapture
