//! `meta.k8s.io/v1` Table answers (`Accept: application/json;as=Table;
//! v=v1;g=meta.k8s.io`), as `kubectl get` asks for them, with the columns
//! and cells of kube-apiserver's printers
//! (`pkg/printers/internalversion/printers.go`) for nodes, services, events
//! and leases, and of the default table convertor (Name, Created At) for
//! the rest. Like the real server, every column is filled (priority-1
//! columns are what `kubectl get -o wide` adds), and each row carries the
//! object as `includeObject` asks (`Metadata` by default, `None`, `Object`).

use serde_json::{Value, json};

use super::resources::ResourceDef;

/// The media type of a Table answer.
pub(crate) const TABLE_CONTENT_TYPE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";

/// Whether an Accept header asks for a `meta.k8s.io/v1` Table (in any of
/// its comma-separated media ranges).
pub(crate) fn wants_table(accept: &str) -> bool {
    accept.split(',').any(|range| {
        let params: Vec<&str> = range.split(';').map(str::trim).collect();
        params.contains(&"as=Table")
            && params.contains(&"v=v1")
            && params.contains(&"g=meta.k8s.io")
    })
}

/// What each row's `object` holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum IncludeObject {
    None,
    Metadata,
    Object,
}

impl IncludeObject {
    pub(crate) fn parse(v: Option<&str>) -> Result<IncludeObject, String> {
        match v {
            None | Some("") | Some("Metadata") => Ok(IncludeObject::Metadata),
            Some("None") => Ok(IncludeObject::None),
            Some("Object") => Ok(IncludeObject::Object),
            Some(other) => Err(format!(
                "includeObject: Unsupported value: {other:?}: supported values: \"Metadata\", \"None\", \"Object\""
            )),
        }
    }
}

fn col(name: &str, ty: &str, format: &str, priority: u32, description: &str) -> Value {
    json!({"name": name, "type": ty, "format": format, "description": description, "priority": priority})
}

const NAME_DOC: &str = "Name must be unique within a namespace. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
const AGE_DOC: &str =
    "CreationTimestamp is a timestamp representing the server time when this object was created.";

fn columns(def: &ResourceDef) -> Vec<Value> {
    let name = col("Name", "string", "name", 0, NAME_DOC);
    let age = col("Age", "string", "", 0, AGE_DOC);
    match (def.group, def.plural) {
        ("", "nodes") => vec![
            name,
            col("Status", "string", "", 0, "The status of the node"),
            col("Roles", "string", "", 0, "The roles of the node"),
            age,
            col(
                "Version",
                "string",
                "",
                0,
                "Kubelet Version reported by the node.",
            ),
            col(
                "Internal-IP",
                "string",
                "",
                1,
                "List of addresses reachable to the node.",
            ),
            col(
                "External-IP",
                "string",
                "",
                1,
                "List of addresses reachable to the node.",
            ),
            col(
                "OS-Image",
                "string",
                "",
                1,
                "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy)).",
            ),
            col(
                "Kernel-Version",
                "string",
                "",
                1,
                "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64).",
            ),
            col(
                "Container-Runtime",
                "string",
                "",
                1,
                "ContainerRuntime Version reported by the node through runtime remote API (e.g. containerd://1.4.2).",
            ),
        ],
        ("", "services") => vec![
            name,
            col(
                "Type",
                "string",
                "",
                0,
                "type determines how the Service is exposed.",
            ),
            col(
                "Cluster-IP",
                "string",
                "",
                0,
                "clusterIP is the IP address of the service and is usually assigned randomly.",
            ),
            col(
                "External-IP",
                "string",
                "",
                0,
                "externalIPs is a list of IP addresses for which nodes in the cluster will also accept traffic for this service.",
            ),
            col(
                "Port(s)",
                "string",
                "",
                0,
                "The list of ports that are exposed by this service.",
            ),
            age,
            col(
                "Selector",
                "string",
                "",
                1,
                "Route service traffic to pods with label keys and values matching this selector.",
            ),
        ],
        (_, "events") => vec![
            col(
                "Last Seen",
                "string",
                "",
                0,
                "The time at which the most recent occurrence of this event was recorded.",
            ),
            col(
                "Type",
                "string",
                "",
                0,
                "Type of this event (Normal, Warning), new types could be added in the future",
            ),
            col(
                "Reason",
                "string",
                "",
                0,
                "This should be a short, machine understandable string that gives the reason for the transition into the object's current status.",
            ),
            col(
                "Object",
                "string",
                "",
                0,
                "The object that this event is about.",
            ),
            col(
                "Subobject",
                "string",
                "",
                1,
                "If referring to a piece of an object instead of an entire object, this string should contain a valid JSON/Go field access statement, such as desiredState.manifest.containers[2].",
            ),
            col(
                "Source",
                "string",
                "",
                1,
                "The component reporting this event. Should be a short machine understandable string.",
            ),
            col(
                "Message",
                "string",
                "",
                0,
                "A human-readable description of the status of this operation.",
            ),
            col(
                "First Seen",
                "string",
                "",
                1,
                "The time at which the event was first recorded. (Time of server receipt is in TypeMeta.)",
            ),
            col(
                "Count",
                "string",
                "",
                1,
                "The number of times this event has occurred.",
            ),
            col("Name", "string", "name", 1, NAME_DOC),
        ],
        ("coordination.k8s.io", "leases") => vec![
            name,
            col(
                "Holder",
                "string",
                "",
                0,
                "holderIdentity contains the identity of the holder of a current lease.",
            ),
            age,
        ],
        _ => vec![name, col("Created At", "date", "", 0, AGE_DOC)],
    }
}

/// `duration.HumanDuration` of apimachinery.
pub(crate) fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    if secs < 0 {
        return "0s".into();
    }
    if secs < 120 {
        return format!("{secs}s");
    }
    let minutes = secs / 60;
    if minutes < 10 {
        let s = secs % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = secs / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{dy}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// `translateTimestampSince`: "<unknown>" for a missing time.
fn since(v: Option<&Value>, now: chrono::DateTime<chrono::Utc>) -> String {
    match v
        .and_then(Value::as_str)
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
    {
        Some(t) => human_duration((now - t.with_timezone(&chrono::Utc)).num_seconds()),
        None => "<unknown>".into(),
    }
}

fn s<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn strings(v: &Value, pointer: &str) -> Vec<String> {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn node_address(v: &Value, ty: &str) -> String {
    v.pointer("/status/addresses")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().find(|x| s(x, "/type") == ty))
        .map_or_else(|| "<none>".to_string(), |x| s(x, "/address").to_string())
}

fn or(s: &str, default: &str) -> String {
    if s.is_empty() { default } else { s }.to_string()
}

fn cells(def: &ResourceDef, v: &Value, now: chrono::DateTime<chrono::Utc>) -> Vec<Value> {
    let name = s(v, "/metadata/name");
    let age = since(v.pointer("/metadata/creationTimestamp"), now);
    match (def.group, def.plural) {
        ("", "nodes") => {
            let mut status: Vec<String> = v
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .and_then(|c| c.iter().find(|c| s(c, "/type") == "Ready"))
                .map(|c| {
                    if s(c, "/status") == "True" {
                        "Ready".to_string()
                    } else {
                        "NotReady".to_string()
                    }
                })
                .into_iter()
                .collect();
            if status.is_empty() {
                status.push("Unknown".into());
            }
            if v.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
                status.push("SchedulingDisabled".into());
            }
            let mut roles: Vec<String> = v
                .pointer("/metadata/labels")
                .and_then(Value::as_object)
                .map(|labels| {
                    labels
                        .iter()
                        .filter_map(|(k, val)| {
                            if let Some(role) = k.strip_prefix("node-role.kubernetes.io/") {
                                (!role.is_empty()).then(|| role.to_string())
                            } else if k == "kubernetes.io/role" {
                                val.as_str().filter(|r| !r.is_empty()).map(str::to_string)
                            } else {
                                None
                            }
                        })
                        .collect()
                })
                .unwrap_or_default();
            roles.sort();
            roles.dedup();
            vec![
                json!(name),
                json!(status.join(",")),
                json!(if roles.is_empty() {
                    "<none>".to_string()
                } else {
                    roles.join(",")
                }),
                json!(age),
                json!(s(v, "/status/nodeInfo/kubeletVersion")),
                json!(node_address(v, "InternalIP")),
                json!(node_address(v, "ExternalIP")),
                json!(or(s(v, "/status/nodeInfo/osImage"), "<unknown>")),
                json!(or(s(v, "/status/nodeInfo/kernelVersion"), "<unknown>")),
                json!(or(
                    s(v, "/status/nodeInfo/containerRuntimeVersion"),
                    "<unknown>"
                )),
            ]
        }
        ("", "services") => {
            let ty = s(v, "/spec/type");
            let cluster_ip = strings(v, "/spec/clusterIPs")
                .into_iter()
                .next()
                .unwrap_or_else(|| "<none>".into());
            let external_ips = strings(v, "/spec/externalIPs");
            let external = match ty {
                "ClusterIP" | "NodePort" if !external_ips.is_empty() => external_ips.join(","),
                "ClusterIP" | "NodePort" => "<none>".into(),
                "LoadBalancer" => {
                    let mut lb: Vec<String> = v
                        .pointer("/status/loadBalancer/ingress")
                        .and_then(Value::as_array)
                        .map(|a| {
                            a.iter()
                                .filter_map(|i| {
                                    let ip = s(i, "/ip");
                                    let host = s(i, "/hostname");
                                    if !ip.is_empty() {
                                        Some(ip.to_string())
                                    } else if !host.is_empty() {
                                        Some(host.to_string())
                                    } else {
                                        None
                                    }
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    lb.sort();
                    lb.dedup();
                    lb.extend(external_ips);
                    if lb.is_empty() {
                        "<pending>".into()
                    } else {
                        lb.join(",")
                    }
                }
                "ExternalName" => s(v, "/spec/externalName").to_string(),
                _ => "<unknown>".into(),
            };
            let ports: Vec<String> = v
                .pointer("/spec/ports")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .map(|p| {
                            let port = p.get("port").and_then(Value::as_i64).unwrap_or(0);
                            let proto = s(p, "/protocol");
                            match p.get("nodePort").and_then(Value::as_i64).filter(|n| *n > 0) {
                                Some(n) => format!("{port}:{n}/{proto}"),
                                None => format!("{port}/{proto}"),
                            }
                        })
                        .collect()
                })
                .unwrap_or_default();
            let mut selector: Vec<String> = v
                .pointer("/spec/selector")
                .and_then(Value::as_object)
                .map(|m| {
                    m.iter()
                        .map(|(k, val)| format!("{k}={}", val.as_str().unwrap_or_default()))
                        .collect()
                })
                .unwrap_or_default();
            selector.sort();
            vec![
                json!(name),
                json!(ty),
                json!(cluster_ip),
                json!(external),
                json!(if ports.is_empty() {
                    "<none>".to_string()
                } else {
                    ports.join(",")
                }),
                json!(age),
                json!(if selector.is_empty() {
                    "<none>".to_string()
                } else {
                    selector.join(",")
                }),
            ]
        }
        (_, "events") => {
            // Cells from the core/v1 form, in which both groups' events are stored.
            let mut first = since(v.pointer("/firstTimestamp").filter(|t| !t.is_null()), now);
            if v.pointer("/firstTimestamp").is_none_or(Value::is_null) {
                first = since(v.pointer("/eventTime").filter(|t| !t.is_null()), now);
            }
            let mut last = if v.pointer("/lastTimestamp").is_none_or(Value::is_null) {
                first.clone()
            } else {
                since(v.pointer("/lastTimestamp"), now)
            };
            let mut count = v.get("count").and_then(Value::as_i64).unwrap_or(0);
            if let Some(series) = v.get("series").filter(|x| x.is_object()) {
                last = since(series.get("lastObservedTime"), now);
                count = series.get("count").and_then(Value::as_i64).unwrap_or(0);
            } else if count == 0 {
                count = 1;
            }
            let kind = s(v, "/involvedObject/kind").to_lowercase();
            let obj_name = s(v, "/involvedObject/name");
            let target = if obj_name.is_empty() {
                kind
            } else {
                format!("{kind}/{obj_name}")
            };
            let component = or(s(v, "/source/component"), s(v, "/reportingComponent"));
            let instance = or(s(v, "/source/host"), s(v, "/reportingInstance"));
            let source = if instance.is_empty() {
                component
            } else {
                format!("{component}, {instance}")
            };
            vec![
                json!(last),
                json!(s(v, "/type")),
                json!(s(v, "/reason")),
                json!(target),
                json!(s(v, "/involvedObject/fieldPath")),
                json!(source),
                json!(s(v, "/message").trim()),
                json!(first),
                json!(count),
                json!(name),
            ]
        }
        ("coordination.k8s.io", "leases") => {
            vec![json!(name), json!(s(v, "/spec/holderIdentity")), json!(age)]
        }
        _ => vec![
            json!(name),
            v.pointer("/metadata/creationTimestamp")
                .cloned()
                .unwrap_or(Value::Null),
        ],
    }
}

/// A Table of `objects`: each as stored (cells are computed from it, as
/// the real printers work on the internal form) and as the resource serves
/// it (for the row's `object`).
pub(crate) fn table(
    def: &ResourceDef,
    objects: &[(&Value, Value)],
    metadata: Value,
    include: IncludeObject,
) -> Value {
    let now = chrono::Utc::now();
    let rows: Vec<Value> = objects
        .iter()
        .map(|(stored, o)| {
            let mut row = json!({"cells": cells(def, stored, now)});
            match include {
                IncludeObject::None => {}
                IncludeObject::Metadata => {
                    row["object"] = json!({
                        "kind": "PartialObjectMetadata",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": o.get("metadata").cloned().unwrap_or(json!({})),
                    });
                }
                IncludeObject::Object => row["object"] = o.clone(),
            }
            row
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": columns(def),
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources::{RESOURCES, find};

    #[test]
    fn apiserver_table_human_durations_match_apimachinery() {
        let cases = [
            (-5, "<invalid>"),
            (-1, "0s"),
            (59, "59s"),
            (119, "119s"),
            (120, "2m"),
            (125, "2m5s"),
            (600, "10m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 60, "3h1m"),
            (10 * 3600, "10h"),
            (3 * 86400, "3d"),
            (3 * 86400 + 3600, "3d1h"),
            (30 * 86400, "30d"),
            (3 * 365 * 86400, "3y"),
        ];
        for (secs, want) in cases {
            assert_eq!(human_duration(secs), want, "{secs}s");
        }
    }

    #[test]
    fn apiserver_table_service_cells_show_the_external_ip() {
        let def = &RESOURCES[find("", "v1", "services").unwrap_or(0)];
        let svc = json!({
            "metadata": {"name": "web", "creationTimestamp": "2020-01-01T00:00:00Z"},
            "spec": {"type": "LoadBalancer", "clusterIPs": ["10.96.0.10"], "selector": {"b": "2", "a": "1"},
                     "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}]},
            "status": {"loadBalancer": {"ingress": [{"hostname": "a.elb.amazonaws.com"}]}},
        });
        let t = table(def, &[(&svc, svc.clone())], json!({}), IncludeObject::None);
        let cells = &t["rows"][0]["cells"];
        assert_eq!(cells[0], "web");
        assert_eq!(cells[1], "LoadBalancer");
        assert_eq!(cells[2], "10.96.0.10");
        assert_eq!(cells[3], "a.elb.amazonaws.com");
        assert_eq!(cells[4], "80:30080/TCP,53/UDP");
        assert_eq!(cells[6], "a=1,b=2");
        assert_eq!(t["columnDefinitions"][3]["name"], "External-IP");
        assert!(t["rows"][0].get("object").is_none());
        assert!(wants_table(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
        ));
        assert!(!wants_table("application/json"));
    }
}
