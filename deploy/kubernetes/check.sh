#!/usr/bin/env bash
# make deploy-check: the manifests, checked without a cluster.
#
#   deploy/kubernetes/*.yaml        kubernetes-validate --strict (bundled JSON schemas, offline)
#                                   against Kubernetes 1.27 (gRPC probes' first GA release) and
#                                   KUBE_VERSION; an unknown field, a wrong type or a kind
#                                   without a schema fails
#   deploy/kubernetes/envoy/*.yaml  envoy --mode validate (Envoy 1.40 from make deps-envoy)
#   deploy/kubernetes/envoy-gateway the core resources (ConfigMap) as above; Envoy Gateway's
#                                   CRDs (EnvoyPatchPolicy, BackendTrafficPolicy) have no bundled
#                                   schema, so they are only parsed, with a notice; the Envoy
#                                   config the patch adds goes through envoy --mode validate, and
#                                   the EnvoyGateway config in managed-ratelimit.yaml is parsed
#                                   and must swap in this image with a Redis backend
#
# Environment (mk/image.mk sets them): KUBE_VALIDATE (kubernetes-validate's pip --target
# directory), KUBE_VERSION, ENVOY.
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${KUBE_VALIDATE:?KUBE_VALIDATE is not set}" "${KUBE_VERSION:?KUBE_VERSION is not set}" "${ENVOY:?ENVOY is not set}"
validate() { PYTHONPATH="$KUBE_VALIDATE${PYTHONPATH:+:$PYTHONPATH}" python3 -m kubernetes_validate "$@"; }
failed=0 passed=0

for version in 1.27.0 "$KUBE_VERSION"; do
    for file in deploy/kubernetes/*.yaml; do
        # A warning (a kind with no schema) fails too: every core manifest must be checked.
        if out=$(validate --strict -k "$version" "$file" 2>&1) && ! grep -q '^WARN' <<<"$out"; then
            passed=$((passed + 1))
        else
            echo "$out" >&2
            failed=$((failed + 1))
        fi
    done
    for file in deploy/kubernetes/envoy-gateway/*.yaml; do
        if out=$(validate --strict -k "$version" "$file" 2>&1); then
            passed=$((passed + 1))
            grep '^WARN' <<<"$out" | sed 's/^WARN /notice: not schema-checked: /' >&2 || true
        else
            echo "$out" >&2
            failed=$((failed + 1))
        fi
    done
done

# Envoy does not check at load time that an envoy_grpc cluster_name names a cluster (the gRPC
# client is made on first use), so that link is checked here.
grpc_clusters_exist() { # file
    PYTHONPATH="$KUBE_VALIDATE" python3 - "$1" <<'PY'
import sys, yaml
config = yaml.safe_load(open(sys.argv[1]))
names = {c["name"] for c in config["static_resources"]["clusters"]}
def walk(node):
    if isinstance(node, dict):
        wanted = node.get("envoy_grpc", {}).get("cluster_name")
        if wanted is not None and wanted not in names:
            sys.exit(f"{sys.argv[1]}: envoy_grpc names cluster {wanted!r}, which is not defined")
        for v in node.values(): walk(v)
    elif isinstance(node, list):
        for v in node: walk(v)
walk(config)
PY
}
for file in deploy/kubernetes/envoy/*.yaml; do
    if out=$("$ENVOY" --mode validate -c "$file" --log-level error 2>&1) && out=$(grpc_clusters_exist "$file" 2>&1); then
        passed=$((passed + 1))
    else
        echo "$file: refused:" >&2
        echo "$out" | tail -n 5 >&2
        failed=$((failed + 1))
    fi
done
# The Envoy Gateway patch's values are Envoy config: put them into a bootstrap around an empty
# listener and let Envoy check them too (the filter, the descriptors, the cluster).
patch_bootstrap="$(mktemp --suffix .yaml)"
trap 'rm -f "$patch_bootstrap"' EXIT
if ! PYTHONPATH="$KUBE_VALIDATE" python3 - deploy/kubernetes/envoy-gateway/ratelimit-patch.yaml >"$patch_bootstrap" <<'PY'
import json, sys, yaml
policy = next(d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d.get("kind") == "EnvoyPatchPolicy")
by_type = {p["type"].rsplit(".", 1)[-1]: p["operation"]["value"] for p in policy["spec"]["jsonPatches"]}
# Envoy checks neither name link at load time (the gRPC client is made on first use).
grpc = by_type["Listener"]["typed_config"]["rate_limit_service"]["grpc_service"]["envoy_grpc"]["cluster_name"]
if grpc != by_type["Cluster"]["name"]:
    sys.exit(f"the filter asks cluster {grpc!r}, the patch adds {by_type['Cluster']['name']!r}")
hcm = {
    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
    "stat_prefix": "check",
    "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "rate_limits": by_type["RouteConfiguration"],
                                        "routes": [{"match": {"prefix": "/"}, "direct_response": {"status": 200}}]}]},
    "http_filters": [by_type["Listener"], {"name": "envoy.filters.http.router", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
}
print(json.dumps({"static_resources": {
    "listeners": [{"name": "check", "address": {"socket_address": {"address": "127.0.0.1", "port_value": 10000}},
                   "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}]}],
    "clusters": [by_type["Cluster"]]}}))
PY
then
    echo "deploy/kubernetes/envoy-gateway/ratelimit-patch.yaml: see above" >&2
    failed=$((failed + 1))
elif out=$("$ENVOY" --mode validate -c "$patch_bootstrap" --log-level error 2>&1); then
    passed=$((passed + 1))
else
    echo "deploy/kubernetes/envoy-gateway/ratelimit-patch.yaml: its Envoy config, refused by envoy --mode validate:" >&2
    echo "$out" | tail -n 5 >&2
    failed=$((failed + 1))
fi
# The EnvoyGateway config inside managed-ratelimit.yaml's ConfigMap is a string to the
# schema: parse it and check the fields that swap the image in and give the Redis.
if out=$(PYTHONPATH="$KUBE_VALIDATE" python3 - deploy/kubernetes/envoy-gateway/managed-ratelimit.yaml 2>&1 <<'PY'
import sys, yaml
cm = next(d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d.get("kind") == "ConfigMap")
eg = yaml.safe_load(cm["data"]["envoy-gateway.yaml"])
assert eg["kind"] == "EnvoyGateway", eg.get("kind")
image = eg["provider"]["kubernetes"]["rateLimitDeployment"]["container"]["image"]
assert image.split("/")[-1].startswith("redis-rl-envoy:"), image
backend = eg["rateLimit"]["backend"]
assert backend["type"] == "Redis" and backend["redis"]["url"], backend
PY
); then
    passed=$((passed + 1))
else
    echo "deploy/kubernetes/envoy-gateway/managed-ratelimit.yaml: its EnvoyGateway config:" >&2
    echo "$out" | tail -n 5 >&2
    failed=$((failed + 1))
fi
echo "deploy-check: $passed passed, $failed failed"
[ "$failed" = 0 ]
