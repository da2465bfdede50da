//! The three classic patch types: JSON merge patch (RFC 7386), JSON patch
//! (RFC 6902) and the Kubernetes strategic merge patch, whose list handling
//! is driven by the per-resource list table in `resources`.

use serde_json::{Map, Value};

use super::errors::ApiError;
use super::resources::{ResourceDef, SmpList};

/// Applies an RFC 7386 merge patch.
pub(crate) fn merge_patch(orig: &Value, patch: &Value) -> Value {
    let mut out = orig.clone();
    json_patch::merge(&mut out, patch);
    out
}

/// Applies an RFC 6902 JSON patch; a failed `test` or a bad path is a 422,
/// as with the real server.
pub(crate) fn json_patch(orig: &Value, patch: &Value) -> Result<Value, ApiError> {
    let ops: json_patch::Patch = serde_json::from_value(patch.clone())
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    let mut out = orig.clone();
    json_patch::patch(&mut out, &ops).map_err(|e| {
        ApiError::unprocessable(format!(
            "the server rejected our request due to an error in our request: {e}"
        ))
    })?;
    Ok(out)
}

/// Applies a strategic merge patch to `orig`.
pub(crate) fn strategic_merge_patch(
    orig: &Value,
    patch: &Value,
    res: &ResourceDef,
) -> Result<Value, ApiError> {
    let (Some(orig_map), Some(patch_map)) = (orig.as_object(), patch.as_object()) else {
        return Err(ApiError::bad_request(
            "a strategic merge patch must be a JSON object",
        ));
    };
    let mut out = orig_map.clone();
    let deleted = smp_object(&mut out, patch_map, "", res).map_err(|e| {
        ApiError::unprocessable(format!("unable to apply strategic merge patch: {e}"))
    })?;
    if deleted {
        return Err(ApiError::bad_request(
            "a strategic merge patch may not delete the whole object",
        ));
    }
    Ok(Value::Object(out))
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// Merges `patch` into `orig`; returns true when the patch asks to delete
/// this whole map (`$patch: delete`).
fn smp_object(
    orig: &mut Map<String, Value>,
    patch: &Map<String, Value>,
    path: &str,
    res: &ResourceDef,
) -> Result<bool, String> {
    match patch.get("$patch").map(|v| v.as_str()) {
        None | Some(Some("merge")) => {}
        Some(Some("delete")) => return Ok(true),
        Some(Some("replace")) => {
            let mut fresh = Map::new();
            let mut rest = patch.clone();
            rest.remove("$patch");
            smp_object(&mut fresh, &rest, path, res)?;
            *orig = fresh;
            return Ok(false);
        }
        Some(other) => return Err(format!("unknown patch type {other:?} at {path:?}")),
    }

    for (key, value) in patch {
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            let drop = value
                .as_array()
                .ok_or_else(|| format!("{key} must be a list"))?;
            if let Some(Value::Array(list)) = orig.get_mut(field) {
                list.retain(|v| !drop.contains(v));
                if list.is_empty() {
                    orig.remove(field);
                }
            }
        }
    }

    for (key, value) in patch {
        if key.starts_with('$') {
            continue;
        }
        let child = join(path, key);
        match value {
            Value::Null => {
                orig.remove(key);
            }
            Value::Object(p) => {
                let delete = match orig.get_mut(key) {
                    Some(Value::Object(o)) => smp_object(o, p, &child, res)?,
                    _ => {
                        let mut fresh = Map::new();
                        let delete = smp_object(&mut fresh, p, &child, res)?;
                        orig.insert(key.clone(), Value::Object(fresh));
                        delete
                    }
                };
                if delete {
                    orig.remove(key);
                }
            }
            Value::Array(items) => {
                let merged = smp_list(orig.get(key), items, &child, res)?;
                orig.insert(key.clone(), merged);
            }
            scalar => {
                orig.insert(key.clone(), scalar.clone());
            }
        }
    }

    for (key, value) in patch {
        if let Some(field) = key.strip_prefix("$setElementOrder/") {
            let order = value
                .as_array()
                .ok_or_else(|| format!("{key} must be a list"))?;
            let child = join(path, field);
            if let Some(Value::Array(list)) = orig.get_mut(field) {
                reorder(list, order, merge_key(res, &child));
            }
        }
    }

    if let Some(retain) = patch.get("$retainKeys") {
        let keep: Vec<&str> = retain
            .as_array()
            .ok_or("$retainKeys must be a list")?
            .iter()
            .filter_map(Value::as_str)
            .collect();
        orig.retain(|k, _| keep.contains(&k.as_str()));
    }
    Ok(false)
}

fn merge_key(res: &ResourceDef, path: &str) -> Option<&'static str> {
    match res.list_rule(path).map(|r| r.smp) {
        Some(SmpList::MergeKey(k)) => Some(k),
        _ => None,
    }
}

/// Orders `list` as `order` says; items it does not name keep their
/// relative order after the named ones.
fn reorder(list: &mut Vec<Value>, order: &[Value], key: Option<&str>) {
    let ident = |v: &Value| -> Value {
        match key {
            Some(k) => v.get(k).cloned().unwrap_or(Value::Null),
            None => v.clone(),
        }
    };
    let mut rest: Vec<Value> = std::mem::take(list);
    for o in order {
        let want = ident(o);
        if let Some(pos) = rest.iter().position(|item| ident(item) == want) {
            list.push(rest.remove(pos));
        }
    }
    list.extend(rest);
}

fn is_directive(item: &Value, which: &str) -> bool {
    item.get("$patch").and_then(Value::as_str) == Some(which)
}

fn smp_list(
    orig: Option<&Value>,
    patch: &[Value],
    path: &str,
    res: &ResourceDef,
) -> Result<Value, String> {
    let strategy = res
        .list_rule(path)
        .map(|r| r.smp)
        .unwrap_or(SmpList::Replace);
    let orig_items: Vec<Value> = orig.and_then(Value::as_array).cloned().unwrap_or_default();
    match strategy {
        SmpList::Replace => Ok(Value::Array(patch.to_vec())),
        SmpList::MergePrimitive => {
            if patch.iter().any(|p| is_directive(p, "replace")) {
                return Ok(Value::Array(
                    patch.iter().filter(|p| !p.is_object()).cloned().collect(),
                ));
            }
            let mut out = orig_items;
            for p in patch {
                if !out.contains(p) {
                    out.push(p.clone());
                }
            }
            Ok(Value::Array(out))
        }
        SmpList::MergeKey(key) => {
            let strip = |item: &Map<String, Value>| -> Result<Value, String> {
                let mut fresh = Map::new();
                smp_object(&mut fresh, item, path, res)?;
                Ok(Value::Object(fresh))
            };
            if patch.iter().any(|p| is_directive(p, "replace")) {
                let mut out = Vec::new();
                for p in patch.iter().filter(|p| !is_directive(p, "replace")) {
                    let m = p
                        .as_object()
                        .ok_or_else(|| format!("{path}: list items must be objects"))?;
                    out.push(strip(m)?);
                }
                return Ok(Value::Array(out));
            }
            let mut out = orig_items;
            for p in patch {
                let m = p
                    .as_object()
                    .ok_or_else(|| format!("{path}: list items must be objects"))?;
                let kv = m.get(key).ok_or_else(|| {
                    format!("map: {p} does not contain declared merge key: {key}")
                })?;
                if is_directive(p, "delete") {
                    out.retain(|o| o.get(key) != Some(kv));
                    continue;
                }
                match out.iter().position(|o| o.get(key) == Some(kv)) {
                    Some(pos) => {
                        let delete = match out.get_mut(pos) {
                            Some(Value::Object(o)) => smp_object(o, m, path, res)?,
                            _ => false,
                        };
                        if delete {
                            out.remove(pos);
                        }
                    }
                    None => out.push(strip(m)?),
                }
            }
            Ok(Value::Array(out))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources::{RESOURCES, find};
    use serde_json::json;

    fn res(plural: &str) -> &'static ResourceDef {
        &RESOURCES[find("", "v1", plural).unwrap_or(0)]
    }

    fn smp(orig: Value, patch: Value, plural: &str) -> Value {
        strategic_merge_patch(&orig, &patch, res(plural))
            .unwrap_or_else(|e| json!({"error": e.message}))
    }

    #[test]
    fn apiserver_smp_taints_replace_and_conditions_merge() {
        let node = json!({
            "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}, {"key": "b", "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "DiskPressure", "status": "False"}]},
        });
        let out = smp(
            node,
            json!({
                "spec": {"taints": [{"key": "c", "effect": "NoExecute"}]},
                "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "PIDPressure", "status": "False"}]},
            }),
            "nodes",
        );
        assert_eq!(
            out["spec"]["taints"],
            json!([{"key": "c", "effect": "NoExecute"}])
        );
        assert_eq!(
            out["status"]["conditions"],
            json!([
                {"type": "Ready", "status": "True"},
                {"type": "DiskPressure", "status": "False"},
                {"type": "PIDPressure", "status": "False"}
            ])
        );
    }

    #[test]
    fn apiserver_smp_directives() {
        let node = json!({
            "metadata": {"finalizers": ["a", "b"]},
            "spec": {"podCIDRs": ["10.0.0.0/24"]},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": "h"}]},
        });
        let out = smp(
            node.clone(),
            json!({
                "metadata": {"finalizers": ["c", "a"], "$deleteFromPrimitiveList/finalizers": ["b"]},
                "spec": {"podCIDRs": ["10.0.1.0/24"]},
                "status": {"addresses": [{"type": "Hostname", "$patch": "delete"}, {"type": "ExternalIP", "address": "1.2.3.4"}]},
            }),
            "nodes",
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "c"]));
        assert_eq!(
            out["spec"]["podCIDRs"],
            json!(["10.0.0.0/24", "10.0.1.0/24"])
        );
        assert_eq!(
            out["status"]["addresses"],
            json!([{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "ExternalIP", "address": "1.2.3.4"}])
        );
        let replaced = smp(
            node.clone(),
            json!({"status": {"addresses": [{"$patch": "replace"}, {"type": "Hostname", "address": "x"}]}}),
            "nodes",
        );
        assert_eq!(
            replaced["status"]["addresses"],
            json!([{"type": "Hostname", "address": "x"}])
        );
        let map_replace = smp(
            node.clone(),
            json!({"spec": {"$patch": "replace", "unschedulable": true}}),
            "nodes",
        );
        assert_eq!(map_replace["spec"], json!({"unschedulable": true}));
        let map_delete = smp(node.clone(), json!({"spec": {"$patch": "delete"}}), "nodes");
        assert_eq!(map_delete.get("spec"), None);
        let retain = smp(
            json!({"spec": {"a": 1, "b": 2, "c": 3}}),
            json!({"spec": {"$retainKeys": ["a", "d"], "d": 4}}),
            "nodes",
        );
        assert_eq!(retain["spec"], json!({"a": 1, "d": 4}));
        let ordered = smp(
            node,
            json!({"status": {"$setElementOrder/addresses": [{"type": "Hostname"}, {"type": "InternalIP"}]}}),
            "nodes",
        );
        assert_eq!(ordered["status"]["addresses"][0]["type"], "Hostname");
    }

    #[test]
    fn apiserver_smp_service_ports_and_ingress() {
        let svc = json!({
            "spec": {"ports": [{"port": 80, "nodePort": 30001}, {"port": 443, "nodePort": 30002}]},
            "status": {"loadBalancer": {"ingress": [{"hostname": "a"}]}},
        });
        let out = smp(
            svc,
            json!({
                "spec": {"ports": [{"port": 443, "name": "https"}]},
                "status": {"loadBalancer": {"ingress": [{"hostname": "b"}]}},
            }),
            "services",
        );
        assert_eq!(
            out["spec"]["ports"][1],
            json!({"port": 443, "nodePort": 30002, "name": "https"})
        );
        assert_eq!(
            out["status"]["loadBalancer"]["ingress"],
            json!([{"hostname": "b"}])
        );
        let bad = strategic_merge_patch(
            &json!({"spec": {}}),
            &json!({"spec": {"ports": [{"name": "x"}]}}),
            res("services"),
        );
        assert_eq!(bad.err().map(|e| e.code), Some(422));
    }

    #[test]
    fn apiserver_json_and_merge_patch() {
        let obj = json!({"metadata": {"labels": {"a": "1"}}, "spec": {"x": 1}});
        let out = merge_patch(
            &obj,
            &json!({"metadata": {"labels": {"a": null, "b": "2"}}}),
        );
        assert_eq!(out["metadata"]["labels"], json!({"b": "2"}));
        let ok = json_patch(
            &obj,
            &json!([{"op": "test", "path": "/spec/x", "value": 1}, {"op": "replace", "path": "/spec/x", "value": 2}]),
        );
        assert_eq!(ok.map(|v| v["spec"]["x"].clone()).ok(), Some(json!(2)));
        let failed = json_patch(
            &obj,
            &json!([{"op": "test", "path": "/spec/x", "value": 5}]),
        );
        assert_eq!(failed.err().map(|e| e.code), Some(422));
        let garbage = json_patch(&obj, &json!({"op": "nope"}));
        assert_eq!(garbage.err().map(|e| e.code), Some(400));
    }
}
