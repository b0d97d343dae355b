"""A backend that mirrors one resource type across the whole fleet and follows its
changes over gRPC, resuming exactly where it stopped after any disconnect.

It holds every object's resourceVersion by (cluster, namespace, name) and keeps what
it needs to resume: on a single server the revision of the last change or bookmark
(`since_revision`), through a router the last bookmark's `position_token` and the
position of each change after it (`resume_token`, `resume_positions`). When the
position is no longer held (OUT_OF_RANGE) it lists again; when the server is away
(UNAVAILABLE) it waits and resumes.

Generate the client first (docs/querying.md, "Clients in other languages"):

    pip install grpcio-tools
    python -m grpc_tools.protoc -I proto --python_out=gen --grpc_python_out=gen \
        proto/fleetscope/v1/fleet.proto
    PYTHONPATH=gen python examples/python/mirror.py --server 127.0.0.1:50051
"""

import argparse
import sys
import time

import grpc

from fleetscope.v1 import fleet_pb2, fleet_pb2_grpc

E = fleet_pb2.EventType
# Waits that end by themselves: try again in a moment.
RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
}


class Mirror:
    """The objects, and where the stream stands."""

    def __init__(self):
        self.objects = {}
        self.revision = 0
        self.token = ""
        self.after = {}
        self.listing = True
        self.changes = 0

    def request(self, resource):
        r = fleet_pb2.WatchRequest(query=fleet_pb2.Query(resource=resource))
        if self.token:
            r.resume_token = self.token
            r.resume_positions.extend(self.after.values())
        elif self.revision and not self.listing:
            r.since_revision = self.revision
        else:
            self.objects.clear()
            self.listing = True
            r.send_initial_events = True
        return r

    def forget_position(self):
        self.revision, self.token, self.after = 0, "", {}

    def take(self, e):
        key = (e.object.cluster, e.object.namespace, e.object.name)
        if e.type in (E.EVENT_TYPE_ADDED, E.EVENT_TYPE_MODIFIED):
            self.objects[key] = e.object.resource_version
        elif e.type == E.EVENT_TYPE_DELETED:
            self.objects.pop(key, None)
        elif e.type == E.EVENT_TYPE_INITIAL_EVENTS_END:
            self.listing = False
            print(f"listed: {len(self.objects)} objects", flush=True)
        elif e.type == E.EVENT_TYPE_RESET:
            cluster = e.position.cluster
            self.objects = {k: v for k, v in self.objects.items() if k[0] != cluster}
        elif e.type == E.EVENT_TYPE_CLUSTER_STATUS:
            print(f"cluster {e.cluster.cluster}: {e.cluster.message}", flush=True)
        if e.type in (E.EVENT_TYPE_ADDED, E.EVENT_TYPE_MODIFIED, E.EVENT_TYPE_DELETED):
            if not self.listing:
                self.changes += 1
            if self.token and e.position.cluster:
                self.after[e.position.cluster] = e.position
        if e.position_token:
            self.token = e.position_token
            self.after = {}
        if e.revision and not self.listing:
            self.revision = e.revision


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", default="127.0.0.1:50051")
    ap.add_argument("--resource", default="configmaps")
    ap.add_argument("--changes", type=int, default=0, help="stop after this many changes (0: never)")
    args = ap.parse_args()
    stub = fleet_pb2_grpc.FleetStub(grpc.insecure_channel(args.server))
    m = Mirror()
    while True:
        try:
            for e in stub.Watch(m.request(args.resource)):
                m.take(e)
                if args.changes and m.changes >= args.changes:
                    print(f"followed {m.changes} changes; holding {len(m.objects)} objects", flush=True)
                    return 0
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.OUT_OF_RANGE:
                print(f"position no longer held ({err.details()}): listing again", flush=True)
                m.forget_position()
            elif err.code() in RETRYABLE:
                time.sleep(1)
            else:
                print(f"{err.code().name}: {err.details()}", file=sys.stderr)
                return 1


if __name__ == "__main__":
    sys.exit(main())
