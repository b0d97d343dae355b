#!/usr/bin/env python3
"""Turns the rendered StatefulSet into what `podman kube play` (4.3) can run.

    kubectl kustomize deploy/kubernetes/base |
      deploy/kubernetes/play/pod-from-statefulset.py --out DIR \\
        --secret fleetscope-tls=TLS_DIR --secret fleetscope-kubeconfig=KC_DIR \\
        --secret fleetscope-tokens=TOKENS_DIR --claim data=DATA_DIR \\
        [--service-account SA_DIR --api HOST:PORT]
    podman kube play --configmap DIR/configmap-*.yaml DIR/pod.yaml

podman plays Pods but not StatefulSets, crashes on Secret volumes and has no
kubelet. The conversion does what the StatefulSet controller and the kubelet would,
and changes nothing else of the pod's spec (its image, args, environment, ports,
probes, security context and every mount path are kept as rendered):

- the pod is the StatefulSet's first (`NAME-0`), its template's labels and spec;
- each volume claim template becomes a host directory (--claim NAME=DIR; podman
  ignores fsGroup, so chown the directory to the pod's user);
- each Secret volume becomes a host directory holding the Secret's files
  (--secret NAME=DIR);
- ConfigMap volumes stay ConfigMap volumes: the rendered ConfigMaps are written to
  DIR/configmap-NAME.yaml for `--configmap`;
- with --service-account and --api, the kubelet's service-account mount
  (/var/run/secrets/kubernetes.io/serviceaccount: token, ca.crt, namespace) and
  KUBERNETES_SERVICE_HOST/PORT, so `inCluster` reaches that API server;
- the pod uses the host's network (podman's pod network cannot reach an API server
  on the host's loopback), so its ports are the host's: podman refuses port
  declarations there, so they are dropped (after the probes' named ports are
  resolved from them).

It also writes DIR/endpoints: each probe as `KIND URL` and each named container
port as `port NAME NUMBER`, resolved from the spec, for checking from the host.
"""

import argparse
import os
import sys

import yaml

SA_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"


def pairs(values, flag):
    out = {}
    for value in values or []:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            sys.exit(f"pod-from-statefulset: {flag} {value!r} is not NAME=DIR")
        out[name] = os.path.abspath(path)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--secret", action="append")
    parser.add_argument("--claim", action="append")
    parser.add_argument("--service-account")
    parser.add_argument("--api")
    args = parser.parse_args()
    secrets = pairs(args.secret, "--secret")
    claims = pairs(args.claim, "--claim")

    docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
    sets = [d for d in docs if d.get("kind") == "StatefulSet"]
    if len(sets) != 1:
        sys.exit(f"pod-from-statefulset: expected one StatefulSet, found {len(sets)}")
    sts = sets[0]
    template = sts["spec"]["template"]
    spec = dict(template["spec"])
    namespace = sts["metadata"].get("namespace", "default")
    os.makedirs(args.out, exist_ok=True)

    volumes = []
    for volume in spec.get("volumes", []):
        if "secret" in volume:
            name = volume["secret"]["secretName"]
            if name not in secrets:
                sys.exit(f"pod-from-statefulset: no --secret {name}=DIR given")
            volume = {"name": volume["name"],
                      "hostPath": {"path": secrets[name], "type": "Directory"}}
        volumes.append(volume)
    for claim in sts["spec"].get("volumeClaimTemplates", []):
        name = claim["metadata"]["name"]
        if name not in claims:
            sys.exit(f"pod-from-statefulset: no --claim {name}=DIR given")
        volumes.append({"name": name,
                        "hostPath": {"path": claims[name], "type": "Directory"}})

    containers = [dict(c) for c in spec["containers"]]
    if args.service_account:
        if not args.api or ":" not in args.api:
            sys.exit("pod-from-statefulset: --service-account needs --api HOST:PORT")
        host, _, port = args.api.rpartition(":")
        volumes.append({"name": "kube-api-access",
                        "hostPath": {"path": os.path.abspath(args.service_account),
                                     "type": "Directory"}})
        for c in containers:
            c["env"] = list(c.get("env", [])) + [
                {"name": "KUBERNETES_SERVICE_HOST", "value": host},
                {"name": "KUBERNETES_SERVICE_PORT", "value": port},
            ]
            c["volumeMounts"] = list(c.get("volumeMounts", [])) + [
                {"name": "kube-api-access", "mountPath": SA_PATH, "readOnly": True}]
    spec["volumes"] = volumes
    spec["hostNetwork"] = True
    spec.pop("serviceAccountName", None)

    with open(os.path.join(args.out, "endpoints"), "w") as f:
        for c in containers:
            ports = {p["name"]: p["containerPort"] for p in c.get("ports", []) if "name" in p}
            for name, number in ports.items():
                f.write(f"port {name} {number}\n")
            for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
                get = (c.get(kind) or {}).get("httpGet")
                if not get:
                    continue
                port = get["port"]
                port = ports.get(port, port)
                scheme = get.get("scheme", "HTTP").lower()
                f.write(f"{kind} {scheme}://127.0.0.1:{port}{get['path']}\n")

    for c in containers:
        c.pop("ports", None)
    spec["containers"] = containers
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": sts["metadata"]["name"] + "-0", "namespace": namespace,
                     "labels": template["metadata"].get("labels", {})},
        "spec": spec,
    }
    with open(os.path.join(args.out, "pod.yaml"), "w") as f:
        yaml.safe_dump(pod, f, sort_keys=False)

    for doc in docs:
        if doc.get("kind") == "ConfigMap":
            path = os.path.join(args.out, f"configmap-{doc['metadata']['name']}.yaml")
            with open(path, "w") as f:
                yaml.safe_dump(doc, f, sort_keys=False)


if __name__ == "__main__":
    main()
