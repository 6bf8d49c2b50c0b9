##@ Release
# The tarball: built for glibc 2.17 and checked on the oldest and newest servers.

.PHONY: dist dist-check

dist: deps ## Release tarball in target/dist/: the .so linked for glibc 2.17 (cargo-zigbuild), docs, SHA256SUMS
	scripts/dist.sh build

dist-check: servers ## Check the tarball: SHA256SUMS, no symbol past GLIBC_2.17 (objdump -T), the suite on Redis 7.0 and Valkey 9 with its .so
	$(CARGO) test --test '*' --no-run
	scripts/dist.sh check
