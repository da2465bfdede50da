#!/usr/bin/env python3
"""Generates schemas.json: the OpenAPI (v2 form) schemas of the kinds the
API test server serves, and every definition they reference.

Source: the Kubernetes JSON schemas shipped by the kubernetes-validate
package (its `_definitions.json` of a Kubernetes release, converted from
kubernetes' published api/openapi-spec), installed in the project
virtualenv by `make tools`. The conversion back to OpenAPI is mechanical:
`type: [T, "null"]` becomes `type: T`, `$ref: #/$defs/X` becomes
`#/definitions/X`, the int-or-string `oneOf` becomes kube's
`{type: string, format: int-or-string}`, and the `enum` the converter adds
to `apiVersion`/`kind` is dropped. Nothing is written by hand.

Usage: gen-openapi.py [--check] [--version v1.37.0]
  --check  fail if schemas.json is not what this script generates.
"""

import argparse
import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
OUT = HERE / "schemas.json"

# The kinds of crates/ccm-testkit/src/apiserver/resources.rs, and the meta
# types its answers and requests use.
ROOTS = [
    "io.k8s.api.core.v1.Namespace",
    "io.k8s.api.core.v1.NamespaceList",
    "io.k8s.api.core.v1.Node",
    "io.k8s.api.core.v1.NodeList",
    "io.k8s.api.core.v1.Service",
    "io.k8s.api.core.v1.ServiceList",
    "io.k8s.api.core.v1.Endpoints",
    "io.k8s.api.core.v1.EndpointsList",
    "io.k8s.api.core.v1.Event",
    "io.k8s.api.core.v1.EventList",
    "io.k8s.api.core.v1.ConfigMap",
    "io.k8s.api.core.v1.ConfigMapList",
    "io.k8s.api.core.v1.Pod",
    "io.k8s.api.core.v1.PodList",
    "io.k8s.api.core.v1.ServiceAccount",
    "io.k8s.api.core.v1.ServiceAccountList",
    "io.k8s.api.events.v1.Event",
    "io.k8s.api.events.v1.EventList",
    "io.k8s.api.coordination.v1.Lease",
    "io.k8s.api.coordination.v1.LeaseList",
    "io.k8s.api.discovery.v1.EndpointSlice",
    "io.k8s.api.discovery.v1.EndpointSliceList",
    "io.k8s.api.admissionregistration.v1.ValidatingWebhookConfiguration",
    "io.k8s.api.admissionregistration.v1.ValidatingWebhookConfigurationList",
    "io.k8s.apimachinery.pkg.apis.meta.v1.Status",
    "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions",
    "io.k8s.apimachinery.pkg.apis.meta.v1.Patch",
    "io.k8s.apimachinery.pkg.apis.meta.v1.WatchEvent",
    "io.k8s.apimachinery.pkg.apis.meta.v1.APIResourceList",
]


def source(version):
    import kubernetes_validate  # noqa: PLC0415 (only needed here)

    base = pathlib.Path(kubernetes_validate.__file__).resolve().parent
    path = base / "kubernetes-json-schema" / f"{version}-local" / "_definitions.json"
    if not path.exists():
        sys.exit(f"{path} does not exist: is kubernetes-validate for {version} installed (make tools)?")
    return json.loads(path.read_text())["$defs"]


def convert(node, key=None):
    if isinstance(node, list):
        return [convert(x) for x in node]
    if not isinstance(node, dict):
        return node
    one_of = node.get("oneOf")
    if one_of and sorted(t.get("type", [None])[0] for t in one_of) == ["integer", "string"]:
        out = {k: v for k, v in node.items() if k != "oneOf"}
        out.update({"type": "string", "format": "int-or-string"})
        return out
    out = {}
    for k, v in node.items():
        if k == "type" and isinstance(v, list):
            types = [t for t in v if t != "null"]
            v = types[0] if len(types) == 1 else types
        elif k == "$ref" and isinstance(v, str):
            v = v.replace("#/$defs/", "#/definitions/")
        elif k == "properties" and isinstance(v, dict):
            v = {
                name: convert(
                    {pk: pv for pk, pv in prop.items() if not (name in ("apiVersion", "kind") and pk == "enum")}
                )
                for name, prop in v.items()
            }
            out[k] = v
            continue
        out[k] = convert(v, k)
    return out


def closure(defs, roots):
    seen, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        if name not in defs:
            sys.exit(f"definition {name} is not in the source schemas")
        seen.add(name)

        def refs(node):
            if isinstance(node, dict):
                for k, v in node.items():
                    if k == "$ref" and isinstance(v, str):
                        yield v.split("/")[-1]
                    else:
                        yield from refs(v)
            elif isinstance(node, list):
                for v in node:
                    yield from refs(v)

        todo.extend(refs(defs[name]))
    return sorted(seen)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true")
    p.add_argument("--version", default="v1.37.0")
    args = p.parse_args()
    defs = source(args.version)
    out = {
        "x-source": f"kubernetes-validate kubernetes-json-schema {args.version}-local/_definitions.json",
        "definitions": {name: convert(defs[name]) for name in closure(defs, ROOTS)},
    }
    text = json.dumps(out, indent=1, sort_keys=True) + "\n"
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            sys.exit(f"{OUT} is out of date: run {pathlib.Path(__file__).name} to regenerate it")
        return
    OUT.write_text(text)


if __name__ == "__main__":
    main()
