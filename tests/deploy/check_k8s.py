#!/usr/bin/env python3
"""Structural check of deploy/k8s/*.yaml (no cluster, no kubeconform here).

Covers, for every document: it parses as YAML; apiVersion/kind are a known pair; metadata.name
is a DNS-1123 name, namespace "hyla"; only known top-level spec fields per kind (catches typos
such as `replica:`). Workloads (StatefulSet, Deployment): selector.matchLabels is a subset of the
pod template's labels; every container has name, image, and ports with names <= 15 characters;
every volumeMount names a volume of the pod or a volumeClaimTemplate; every configMap / secret /
persistentVolumeClaim volume refers to an object defined in these files; probes name a declared
container port (by name or number); env valueFrom.fieldRef paths are from the downward API;
--config arguments point into a mounted ConfigMap and name one of its keys. The StatefulSet's
serviceName is a headless Service (clusterIP: None) selecting its pods, and it has a
volumeClaimTemplate with a storage request. The worker requests nvidia.com/gpu in limits.
Services select at least one workload's pods and their targetPorts exist on those pods. The
Secret has the files the pods expect (admin.key, ca.crt, tls.crt, tls.key).
Prints what it checked; exit 1 naming file, object and field on the first class of problems.
Also writes each ConfigMap *.conf key to OUT_DIR (argv[2]) for the caller to feed to the
binaries' --config parser."""
import os
import re
import sys

import yaml

KNOWN = {
    ("v1", "Namespace"), ("v1", "Service"), ("v1", "ConfigMap"), ("v1", "Secret"),
    ("v1", "PersistentVolumeClaim"), ("apps/v1", "StatefulSet"), ("apps/v1", "Deployment"),
}
SPEC_FIELDS = {
    "StatefulSet": {"serviceName", "replicas", "selector", "template", "volumeClaimTemplates",
                    "podManagementPolicy", "updateStrategy", "persistentVolumeClaimRetentionPolicy",
                    "minReadySeconds", "revisionHistoryLimit", "ordinals"},
    "Deployment": {"replicas", "selector", "template", "strategy", "minReadySeconds",
                   "revisionHistoryLimit", "progressDeadlineSeconds", "paused"},
    "Service": {"type", "clusterIP", "selector", "ports", "sessionAffinity", "externalTrafficPolicy",
                "internalTrafficPolicy", "publishNotReadyAddresses", "loadBalancerIP", "ipFamilyPolicy"},
    "PersistentVolumeClaim": {"accessModes", "resources", "storageClassName", "volumeMode", "selector",
                              "volumeName"},
}
POD_FIELDS = {"containers", "initContainers", "volumes", "securityContext", "terminationGracePeriodSeconds",
              "serviceAccountName", "nodeSelector", "tolerations", "affinity", "runtimeClassName",
              "priorityClassName", "imagePullSecrets", "topologySpreadConstraints"}
CONTAINER_FIELDS = {"name", "image", "command", "args", "env", "envFrom", "ports", "readinessProbe",
                    "livenessProbe", "startupProbe", "resources", "volumeMounts", "lifecycle",
                    "securityContext", "imagePullPolicy", "workingDir"}
FIELD_REFS = {"metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName",
              "spec.serviceAccountName", "status.hostIP", "status.podIP", "status.podIPs"}
DNS = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
errors = []


def err(where, msg):
    errors.append(f"{where}: {msg}")


def main():
    kdir, out_dir = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None
    docs = []
    for fn in sorted(os.listdir(kdir)):
        if fn.endswith((".yaml", ".yml")):
            with open(os.path.join(kdir, fn)) as f:
                for d in yaml.safe_load_all(f):
                    if d is not None:
                        docs.append((fn, d))
    by_kind = {}
    for fn, d in docs:
        kind, name = d.get("kind"), (d.get("metadata") or {}).get("name", "")
        where = f"{fn}: {kind}/{name}"
        if (d.get("apiVersion"), kind) not in KNOWN:
            err(where, f"unknown apiVersion/kind {d.get('apiVersion')}/{kind}")
        if not DNS.match(name or "") or len(name) > 63:
            err(where, "metadata.name is not a DNS-1123 label")
        if kind != "Namespace" and d["metadata"].get("namespace") != "hyla":
            err(where, "metadata.namespace is not hyla")
        extra = set(d.get("spec", {}) or {}) - SPEC_FIELDS.get(kind, set(d.get("spec", {}) or {}))
        if extra:
            err(where, f"unknown spec fields {sorted(extra)}")
        by_kind.setdefault(kind, {})[name] = (fn, d)

    def pod_labels(d):
        return d["spec"]["template"]["metadata"].get("labels", {})

    workloads = {**by_kind.get("StatefulSet", {}), **by_kind.get("Deployment", {})}
    for name, (fn, d) in workloads.items():
        where = f"{fn}: {d['kind']}/{name}"
        spec = d["spec"]
        sel = spec["selector"]["matchLabels"]
        if not sel or any(pod_labels(d).get(k) != v for k, v in sel.items()):
            err(where, "selector.matchLabels is not a subset of the template's labels")
        pod = spec["template"]["spec"]
        if set(pod) - POD_FIELDS:
            err(where, f"unknown pod spec fields {sorted(set(pod) - POD_FIELDS)}")
        vols = {v["name"]: v for v in pod.get("volumes", [])}
        claims = {c["metadata"]["name"] for c in spec.get("volumeClaimTemplates", [])}
        for vn, v in vols.items():
            if "configMap" in v and v["configMap"]["name"] not in by_kind.get("ConfigMap", {}):
                err(where, f"volume {vn}: ConfigMap {v['configMap']['name']} is not defined")
            if "secret" in v and v["secret"]["secretName"] not in by_kind.get("Secret", {}):
                err(where, f"volume {vn}: Secret {v['secret']['secretName']} is not defined")
            if "persistentVolumeClaim" in v and v["persistentVolumeClaim"]["claimName"] not in by_kind.get(
                    "PersistentVolumeClaim", {}):
                err(where, f"volume {vn}: PVC {v['persistentVolumeClaim']['claimName']} is not defined")
        for c in pod["containers"]:
            cw = f"{where} container {c.get('name')}"
            if set(c) - CONTAINER_FIELDS:
                err(cw, f"unknown fields {sorted(set(c) - CONTAINER_FIELDS)}")
            if not c.get("name") or not c.get("image"):
                err(cw, "name and image are required")
            ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
            for pn in ports:
                if pn and len(pn) > 15:
                    err(cw, f"port name {pn} is longer than 15 characters")
            mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
            for path, vn in mounts.items():
                if vn not in vols and vn not in claims:
                    err(cw, f"volumeMount {path} names no volume {vn}")
            for pk in ("readinessProbe", "livenessProbe", "startupProbe"):
                pr = c.get(pk)
                if not pr:
                    continue
                h = pr.get("httpGet") or pr.get("grpc") or pr.get("tcpSocket")
                if h is None:
                    err(cw, f"{pk}: no httpGet, grpc or tcpSocket handler")
                    continue
                port = h.get("port")
                if port not in ports and port not in ports.values():
                    err(cw, f"{pk}: port {port} is not a container port")
            for e in c.get("env", []):
                fr = (e.get("valueFrom") or {}).get("fieldRef")
                if fr and fr["fieldPath"] not in FIELD_REFS:
                    err(cw, f"env {e['name']}: fieldPath {fr['fieldPath']} is not in the downward API")
            args = c.get("args", [])
            if "--config" in args:
                cfg = args[args.index("--config") + 1]
                d_, key = os.path.split(cfg)
                vn = mounts.get(d_)
                cm = vols.get(vn, {}).get("configMap", {}).get("name")
                if not cm:
                    err(cw, f"--config {cfg}: {d_} is not a mounted ConfigMap")
                elif key not in by_kind["ConfigMap"][cm][1].get("data", {}):
                    err(cw, f"--config {cfg}: ConfigMap {cm} has no key {key}")
            if d["kind"] == "Deployment" and c["name"] == "worker":
                if str(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", "")) not in ("1", "2", "4", "8"):
                    err(cw, "the GPU worker does not request nvidia.com/gpu in resources.limits")
        if d["kind"] == "StatefulSet":
            svc = by_kind.get("Service", {}).get(spec.get("serviceName"))
            if not svc or svc[1]["spec"].get("clusterIP") != "None":
                err(where, f"serviceName {spec.get('serviceName')} is not a headless Service here")
            vct = spec.get("volumeClaimTemplates", [])
            if not vct or not all(v["spec"]["resources"]["requests"].get("storage") for v in vct):
                err(where, "needs a volumeClaimTemplate with a storage request")
    for name, (fn, d) in by_kind.get("Service", {}).items():
        where = f"{fn}: Service/{name}"
        sel = d["spec"].get("selector", {})
        matched = [w for w in workloads.values() if sel and all(pod_labels(w[1]).get(k) == v for k, v in sel.items())]
        if not matched:
            err(where, "selects no workload's pods")
            continue
        for p in d["spec"].get("ports", []):
            tp = p.get("targetPort", p.get("port"))
            ok = any(tp == cp.get("name") or tp == cp.get("containerPort")
                     for w in matched for c in w[1]["spec"]["template"]["spec"]["containers"] for cp in c.get("ports", []))
            if not ok:
                err(where, f"targetPort {tp} is not a port of the selected pods")
    for name, (fn, d) in by_kind.get("Secret", {}).items():
        keys = set(d.get("stringData", {})) | set(d.get("data", {}))
        missing = {"admin.key", "ca.crt", "tls.crt", "tls.key"} - keys
        if missing:
            err(f"{fn}: Secret/{name}", f"missing keys {sorted(missing)}")
    if "StatefulSet" not in by_kind or "Deployment" not in by_kind or "Secret" not in by_kind:
        err(kdir, "want a StatefulSet (coordinator), a Deployment (workers) and a Secret")
    if out_dir:
        for name, (fn, d) in by_kind.get("ConfigMap", {}).items():
            for k, v in d.get("data", {}).items():
                if k.endswith(".conf"):
                    with open(os.path.join(out_dir, k), "w") as f:
                        f.write(v)
    if errors:
        print("\n".join("FAIL " + e for e in errors))
        return 1
    print(f"check_k8s: {len(docs)} objects ok: " + ", ".join(f"{k} x{len(v)}" for k, v in sorted(by_kind.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
