"""The whole fleet through fleetscope's Kubernetes API with the Python `kubernetes`
client, unchanged: lists every configmap of every cluster, then watches them from
the list's resourceVersion, printing each event with the cluster the object is in
(the `fleetscope.io/cluster` annotation). In the fleet's view a name carries its
cluster (`CLUSTER:NAME`), so objects of the same name in two clusters are two
objects here too, as in any cache keyed by namespace and name.

    pip install kubernetes
    python examples/python/kube_watch.py --server http://127.0.0.1:50052 --events 10
"""

import argparse
import sys

from kubernetes import client, watch

CLUSTER = "fleetscope.io/cluster"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", default="http://127.0.0.1:50052", help="fleetscope's Kubernetes API")
    ap.add_argument("--events", type=int, default=0, help="stop after this many events (0: never)")
    args = ap.parse_args()
    config = client.Configuration()
    config.host = args.server.rstrip("/") + "/clusters/*"
    v1 = client.CoreV1Api(client.ApiClient(config))
    listed = v1.list_config_map_for_all_namespaces()
    clusters = sorted({(cm.metadata.annotations or {}).get(CLUSTER, "") for cm in listed.items})
    held = {(cm.metadata.namespace, cm.metadata.name): cm for cm in listed.items}
    if len(held) != len(listed.items):
        print(f"{len(listed.items)} configmaps listed, {len(held)} distinct names", file=sys.stderr)
        return 1
    print(f"listed {len(listed.items)} configmaps of {len(clusters)} clusters at {listed.metadata.resource_version}", flush=True)
    seen = 0
    for e in watch.Watch().stream(
        v1.list_config_map_for_all_namespaces,
        resource_version=listed.metadata.resource_version,
        timeout_seconds=60,
    ):
        cm = e["object"]
        cluster = (cm.metadata.annotations or {}).get(CLUSTER, "?")
        print(f"{e['type']} {cm.metadata.namespace}/{cm.metadata.name} (cluster {cluster})", flush=True)
        seen += 1
        if args.events and seen >= args.events:
            print(f"watched {seen} events", flush=True)
            return 0
    return 0 if not args.events else 1


if __name__ == "__main__":
    sys.exit(main())
