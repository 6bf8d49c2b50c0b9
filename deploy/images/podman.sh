# Sourced by build.sh and test.sh: how this project calls podman. Not run on its own.
#
# podman as Debian 12 packages it works on this kind of machine (a container itself) with
# runc as the runtime, the host's network (publishing a port would change the host's
# firewall and ip_forward), and explicit ulimits no higher than the host's hard limits
# (podman's defaults ask for more than a nested container may raise, and runc then fails).

need_podman() {
    command -v podman >/dev/null || {
        echo "$1: podman is not installed (make deps-image installs podman, buildah, debootstrap, runc)" >&2
        exit 1
    }
}

# The smaller of the host's hard limit and what a server needs: Redis asks for maxclients
# (10000) + 32 descriptors; 4096 processes is plenty for one server or one service.
hard_limit() { # ulimit flag, wanted
    local hard
    hard=$(ulimit -H "$1")
    if [ "$hard" = unlimited ] || [ "$hard" -gt "$2" ]; then echo "$2"; else echo "$hard"; fi
}
NOFILE=$(hard_limit -n 10240)
NPROC=$(hard_limit -u 4096)

# Flags every `podman build` and `podman run` here takes.
PODMAN=(podman --runtime runc)
LIMITS=(--network host --ulimit "nofile=$NOFILE:$NOFILE" --ulimit "nproc=$NPROC:$NPROC")

# Image names. localhost/ marks them as built here: nothing is pulled from a registry.
BASE_IMAGE=localhost/redis-rl-base:bookworm
ENVOY_IMAGE=${ENVOY_IMAGE:-localhost/redis-rl-envoy:latest}
REDIS_IMAGE=localhost/redis-rl-server:redis7
VALKEY_IMAGE=localhost/redis-rl-server:valkey9
