#!/bin/sh
# The Rust client as users get it (make dist-rust): `cargo package` of redis-rl-client and
# rl-bucket (its path dependency), both unpacked into a clean directory outside the
# repository, a small program (dist/main.rs) built there against the unpacked crates only
# (rl-bucket through [patch.crates-io], as a private registry would serve it), and run against
# a real redis-server with the module and against plain ones (the script path, and the
# Functions library the program loads first). Then the
# crate's own example (examples/flood.rs) and the axum app users copy (examples/rust, its
# tests) are built there against the same unpacked crates and run against the server with
# the module: what users run is what the package gives them, not the repository's tree.
#
# Run from the repository root. MODULE (the built module), REDIS_SERVER, CARGO and
# DIST_RUST_TARGET (the program's target directory, kept between runs so its dependencies
# build once) may be set.
set -eu

root=$(pwd)
module=${MODULE:-$root/target/debug/libredis_rl.so}
server=${REDIS_SERVER:-redis-server}
cargo=${CARGO:-cargo}
target_dir=${DIST_RUST_TARGET:-$root/target/dist-rust}
version_of() { sed -n 's/^version = "\(.*\)"$/\1/p' "$1" | head -n 1; }
client_version=$(version_of clients/rust/Cargo.toml)
bucket_version=$(version_of crates/rl-bucket/Cargo.toml)

# --exclude-lockfile: both crates are `publish = false`, so cargo has no registry to resolve
# the client's rl-bucket in for a lockfile; a library's lockfile is not used by its users.
# --no-verify: the build below is the verification, against the unpacked crates.
"$cargo" package --quiet -p rl-bucket -p redis-rl-client --no-verify --allow-dirty --exclude-lockfile

work=$(mktemp -d)
pids=""
cleanup() {
    for pid in $pids; do kill "$pid" 2>/dev/null || true; done
    for pid in $pids; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT INT TERM

mkdir -p "$work/crates" "$work/app/src"
tar xzf "target/package/rl-bucket-$bucket_version.crate" -C "$work/crates"
tar xzf "target/package/redis-rl-client-$client_version.crate" -C "$work/crates"
cp clients/rust/dist/main.rs "$work/app/src/main.rs"
# The crate's examples, as packaged (the .crate holds them), built as this program's.
mkdir -p "$work/app/examples"
cp "$work/crates/redis-rl-client-$client_version/examples/"*.rs "$work/app/examples/"
cat > "$work/app/Cargo.toml" <<TOML
[package]
name = "dist-check"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
redis-rl-client = { path = "../crates/redis-rl-client-$client_version" }
redis = { version = "1.8", default-features = false, features = ["tokio-comp", "connection-manager"] }
tokio = { version = "1", features = ["rt"] }

[patch.crates-io]
rl-bucket = { path = "../crates/rl-bucket-$bucket_version" }

[workspace]
TOML
# The repository's versions of the shared dependencies, so this checks the package, not a
# newer release of a dependency; cargo drops what the program does not use.
cp Cargo.lock "$work/app/Cargo.lock"
(cd "$work/app" && CARGO_TARGET_DIR="$target_dir" "$cargo" build --quiet --bins --examples)
program="$target_dir/debug/dist-check"

# The axum example app (examples/rust) with its tests, on the unpacked crate instead of the
# repository's clients/rust; its own lockfile pins its dependencies.
cp -R examples/rust "$work/example-app"
rm -rf "$work/example-app/target"
sed -i "s|path = \"../../clients/rust\"|path = \"../crates/redis-rl-client-$client_version\"|" \
    "$work/example-app/Cargo.toml"
grep -q "crates/redis-rl-client-$client_version" "$work/example-app/Cargo.toml" || {
    echo "dist-rust: examples/rust/Cargo.toml does not name ../../clients/rust" >&2; exit 1; }
cat >> "$work/example-app/Cargo.toml" <<TOML

[patch.crates-io]
rl-bucket = { path = "../crates/rl-bucket-$bucket_version" }
TOML
(cd "$work/example-app" && CARGO_TARGET_DIR="$target_dir" "$cargo" test --quiet --no-run)

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Starts a server (with `--loadmodule ...` when given) and waits for PING; prints its port.
start() {
    port=$(free_port)
    dir="$work/server-$port"
    mkdir -p "$dir"
    "$server" --port "$port" --bind 127.0.0.1 --dir "$dir" --save "" --appendonly no "$@" \
        >"$dir/log" 2>&1 &
    pids="$pids $!"
    tries=0
    until redis-cli -p "$port" ping >/dev/null 2>&1; do
        tries=$((tries + 1))
        if [ "$tries" -gt 100 ]; then cat "$dir/log" >&2; echo "dist-rust: no server" >&2; exit 1; fi
        sleep 0.1
    done
}

start --loadmodule "$module"
"$program" "redis://127.0.0.1:$port/" module "$root/clients/lua/rl.lua"
# flood: 50 calls on a denied key, none allowed (it fails otherwise).
"$target_dir/debug/examples/flood" "$port" dist:flood 50 1 >/dev/null
(cd "$work/example-app" && REDIS_URL="redis://127.0.0.1:$port/" CARGO_TARGET_DIR="$target_dir" \
    "$cargo" test --quiet)
start
"$program" "redis://127.0.0.1:$port/" lua "$root/clients/lua/rl.lua"
start
"$program" "redis://127.0.0.1:$port/" functions "$root/clients/lua/rl.lua"
