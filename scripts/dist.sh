#!/usr/bin/env bash
# The release tarball: a module that loads on any x86_64 Linux with glibc 2.17 or newer
# (RHEL/Rocky 8, Amazon Linux 2, Debian 11, Ubuntu 20.04 and everything later).
#
#   scripts/dist.sh build   build target/dist/redis-rl-<version>-x86_64-linux-gnu.tar.gz
#   scripts/dist.sh check   unpack that tarball, verify SHA256SUMS, fail if the .so needs a
#                           glibc symbol newer than 2.17, then run the integration suite with
#                           it on Redis 7.0 and Valkey 9, or on the servers DIST_CHECK_SERVERS
#                           names (needs make servers and the test binaries)
#
# The host's linker would tie the .so to the host's glibc (2.36 on Debian 12: symbols from
# GLIBC_2.34). cargo-zigbuild links with zig against glibc 2.17's symbol versions instead.
# Both come from PyPI (cargo-zigbuild, ziglang), installed into target/dist-tools so nothing
# system-wide changes. bindgen still runs on the host and needs libclang (make deps).
set -euo pipefail
cd "$(dirname "$0")/.."

GLIBC_MAX=2.17
TRIPLE=x86_64-unknown-linux-gnu
TOOLS="$PWD/target/dist-tools"
# Its own target dir: the glibc-2.17 build shares nothing with the host build, and a
# separate lock lets both run at once.
BUILD_DIR="$PWD/target/dist-build"
OUT="$PWD/target/dist"
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
NAME="redis-rl-$VERSION-x86_64-linux-gnu"
TARBALL="$OUT/$NAME.tar.gz"
CARGO_ZIGBUILD_VERSION=0.24.0
ZIGLANG_VERSION=0.17.0

say() { echo "dist: $*" >&2; }

tools() {
  export PATH="$TOOLS/bin:$PATH" PYTHONPATH="$TOOLS${PYTHONPATH:+:$PYTHONPATH}"
  if cargo-zigbuild --version >/dev/null 2>&1 && python3 -m ziglang version >/dev/null 2>&1; then
    return
  fi
  say "pip install cargo-zigbuild==$CARGO_ZIGBUILD_VERSION ziglang==$ZIGLANG_VERSION into $TOOLS"
  python3 -m pip install --quiet --disable-pip-version-check --upgrade --target "$TOOLS" \
    "cargo-zigbuild==$CARGO_ZIGBUILD_VERSION" "ziglang==$ZIGLANG_VERSION"
}

build() {
  tools
  # bindgen (redis-module's build script) parses redismodule.h with the host's libclang.
  # Left alone, cargo-zigbuild points it at zig's sysroot, where libclang finds no usable libc
  # headers; the host's describe the same x86_64 types (bindgen takes layouts, not symbols).
  local headers
  headers="-isystem $(clang -print-resource-dir)/include -isystem /usr/include/x86_64-linux-gnu -isystem /usr/include"
  # Every spelling bindgen reads (the dashed one takes precedence, and needs env to be set).
  env "BINDGEN_EXTRA_CLANG_ARGS_$TRIPLE=$headers" BINDGEN_EXTRA_CLANG_ARGS="$headers" \
    CARGO_TARGET_DIR="$BUILD_DIR" cargo zigbuild --release --lib --target "$TRIPLE.$GLIBC_MAX"
  local so="$BUILD_DIR/$TRIPLE/release/libredis_rl.so"
  local stage="$OUT/$NAME"
  rm -rf "$stage" "$TARBALL"
  mkdir -p "$stage"
  # Debug info is for developers; the tarball's .so keeps its symbol table for backtraces.
  objcopy --strip-debug "$so" "$stage/libredis_rl.so"
  # docs/ rides along: the README's command table and topic links point into it.
  cp -r redis.conf.example README.md LICENSE CHANGELOG.md docs "$stage/"
  # The fallbacks for servers that may not load modules: the script and the Functions library.
  mkdir -p "$stage/lua"
  cp clients/lua/rl.lua clients/lua/rl_functions.lua "$stage/lua/"
  (cd "$stage" && find . -type f ! -name SHA256SUMS | LC_ALL=C sort | xargs sha256sum >SHA256SUMS)
  # The same sources give the same bytes: fixed order, owner and times (the last commit's).
  local mtime
  mtime=$(git log -1 --format=%ct 2>/dev/null || echo 0)
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$mtime" -C "$OUT" -cf - "$NAME" \
    | gzip -n -9 >"$TARBALL"
  (cd "$OUT" && sha256sum "$NAME.tar.gz" >"$NAME.tar.gz.sha256")
  say "$TARBALL ($(du -h "$TARBALL" | cut -f1)): $(tar -tzf "$TARBALL" | tr '\n' ' ')"
}

# The newest GLIBC_x.y any dynamic symbol of $1 needs, or nothing.
newest_glibc() {
  objdump -T "$1" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n1
}

check() {
  [ -f "$TARBALL" ] || { say "no $TARBALL (make dist)"; exit 1; }
  CHECK_DIR=$(mktemp -d)
  trap 'rm -rf "$CHECK_DIR"' EXIT
  local dir="$CHECK_DIR"
  tar -xzf "$TARBALL" -C "$dir"
  (cd "$dir/$NAME" && sha256sum --quiet -c SHA256SUMS)
  for f in rl.lua rl_functions.lua; do
    cmp -s "$dir/$NAME/lua/$f" "clients/lua/$f" || { say "the tarball's lua/$f differs from clients/lua/$f"; exit 1; }
  done
  local so="$dir/$NAME/libredis_rl.so" newest
  newest=$(newest_glibc "$so")
  [ -n "$newest" ] || { say "objdump -T found no GLIBC symbol versions in $so"; exit 1; }
  if [ "$(printf '%s\n%s\n' "$newest" "$GLIBC_MAX" | sort -V | tail -n1)" != "$GLIBC_MAX" ]; then
    say "the .so needs GLIBC_$newest, newer than $GLIBC_MAX:"
    objdump -T "$so" | grep -E "GLIBC_($(printf '%s' "$newest" | sed 's/\./\\./g'))" >&2
    exit 1
  fi
  say "SHA256SUMS ok; newest glibc symbol version: GLIBC_$newest (at most $GLIBC_MAX)"
  # shellcheck disable=SC2086 # a list of names
  RL_MODULE="$so" scripts/servers.sh test ${DIST_CHECK_SERVERS:-redis-7.0.15 valkey-9.1.2}
}

case "${1:-}" in
  build) build ;;
  check) check ;;
  *) echo "usage: $0 build|check" >&2; exit 2 ;;
esac
