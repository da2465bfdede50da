//! Field ownership (`metadata.managedFields`) and server-side apply.
//!
//! Field sets use the `FieldsV1` vocabulary: `f:<field>` for an object
//! field, `k:{"type":"Ready"}` for an item of a list keyed by its map keys,
//! `v:"value"` for an item of a set, and `.` for "this node itself" when a
//! node also has children. List handling comes from the `SsaList` column of
//! the resource table; lists not in the table are atomic.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::errors::{ApiError, Cause};
use super::resources::{ResourceDef, SsaList};

/// A set of field paths, stored as a tree of `FieldsV1` keys.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct FieldSet {
    member: bool,
    children: BTreeMap<String, FieldSet>,
}

/// One path: a list of `FieldsV1` keys.
pub(crate) type Path = Vec<String>;

impl FieldSet {
    pub fn from_fields_v1(v: &Value) -> FieldSet {
        let mut set = FieldSet::default();
        if let Some(m) = v.as_object() {
            for (k, child) in m {
                if k == "." {
                    set.member = true;
                    continue;
                }
                let mut c = FieldSet::from_fields_v1(child);
                if child.as_object().is_some_and(Map::is_empty) {
                    c.member = true;
                }
                set.children.insert(k.clone(), c);
            }
        }
        set
    }

    pub fn to_fields_v1(&self) -> Value {
        let mut m = Map::new();
        if self.member && !self.children.is_empty() {
            m.insert(".".into(), json!({}));
        }
        for (k, c) in &self.children {
            m.insert(k.clone(), c.to_fields_v1());
        }
        Value::Object(m)
    }

    pub fn is_empty(&self) -> bool {
        !self.member && self.children.values().all(FieldSet::is_empty)
    }

    pub fn insert(&mut self, path: &[String]) {
        match path.split_first() {
            None => self.member = true,
            Some((head, rest)) => self.children.entry(head.clone()).or_default().insert(rest),
        }
    }

    pub fn contains(&self, path: &[String]) -> bool {
        match path.split_first() {
            None => self.member,
            Some((head, rest)) => self.children.get(head).is_some_and(|c| c.contains(rest)),
        }
    }

    /// Whether the set holds `path` or anything below it.
    fn covers(&self, path: &[String]) -> bool {
        match path.split_first() {
            None => !self.is_empty(),
            Some((head, rest)) => self.children.get(head).is_some_and(|c| c.covers(rest)),
        }
    }

    pub fn remove(&mut self, path: &[String]) {
        match path.split_first() {
            None => self.member = false,
            Some((head, rest)) => {
                if let Some(c) = self.children.get_mut(head) {
                    c.remove(rest);
                    if c.is_empty() {
                        self.children.remove(head);
                    }
                }
            }
        }
    }

    /// Every member path, parents before children.
    pub fn members(&self) -> Vec<Path> {
        let mut out = Vec::new();
        self.collect(&mut Vec::new(), &mut out);
        out
    }

    fn collect(&self, prefix: &mut Path, out: &mut Vec<Path>) {
        if self.member {
            out.push(prefix.clone());
        }
        for (k, c) in &self.children {
            prefix.push(k.clone());
            c.collect(prefix, out);
            prefix.pop();
        }
    }

    pub fn union(&mut self, other: &FieldSet) {
        for p in other.members() {
            self.insert(&p);
        }
    }

    pub fn difference(&mut self, other: &FieldSet) {
        for p in other.members() {
            self.remove(&p);
        }
    }

    pub fn intersection(&self, other: &FieldSet) -> FieldSet {
        let mut out = FieldSet::default();
        for p in self.members() {
            if other.contains(&p) {
                out.insert(&p);
            }
        }
        out
    }
}

/// Which part of an object a write may touch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// The main resource of a type without a status subresource: everything.
    All,
    /// The main resource of a type with a status subresource: all but `.status`.
    Main,
    /// The `/status` subresource: `.status` and metadata.
    Status,
}

impl Scope {
    pub fn of(res: &ResourceDef, subresource: Option<&str>) -> Scope {
        match (subresource, res.status_subresource) {
            (Some("status"), _) => Scope::Status,
            (_, true) => Scope::Main,
            (_, false) => Scope::All,
        }
    }

    fn keeps(self, top_key: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Main => top_key != "status",
            Scope::Status => top_key == "status" || top_key == "metadata",
        }
    }
}

/// Fields never tracked: set by the server or identifying the object.
const UNTRACKED_TOP: &[&str] = &["apiVersion", "kind"];
const UNTRACKED_META: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
];

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn ssa_list(res: &ResourceDef, dotted: &str) -> SsaList {
    res.list_rule(dotted)
        .map(|r| r.ssa)
        .unwrap_or(SsaList::Atomic)
}

fn key_elem(item: &Value, keys: &[&str]) -> Option<String> {
    let obj = item.as_object()?;
    let mut m = Map::new();
    for k in keys {
        if let Some(v) = obj.get(*k) {
            m.insert((*k).to_string(), v.clone());
        }
    }
    if m.is_empty() {
        return None;
    }
    Some(format!("k:{}", Value::Object(m)))
}

fn value_elem(item: &Value) -> String {
    format!("v:{item}")
}

/// The top-level keys of `obj` a write in `scope` may track.
fn tracked_top(obj: &Value, scope: Scope) -> Vec<(&String, Value)> {
    let Some(m) = obj.as_object() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (k, v) in m {
        if UNTRACKED_TOP.contains(&k.as_str()) || !scope.keeps(k) {
            continue;
        }
        if k == "metadata" {
            let mut meta = v.as_object().cloned().unwrap_or_default();
            meta.retain(|mk, _| !UNTRACKED_META.contains(&mk.as_str()));
            if meta.is_empty() {
                continue;
            }
            out.push((k, Value::Object(meta)));
        } else {
            out.push((k, v.clone()));
        }
    }
    out
}

/// The fields an object (or an applied configuration) sets.
pub(crate) fn object_fields(obj: &Value, res: &ResourceDef, scope: Scope) -> FieldSet {
    let mut set = FieldSet::default();
    let mut path = Vec::new();
    for (k, v) in tracked_top(obj, scope) {
        path.push(format!("f:{k}"));
        walk(&v, k, &mut path, &mut set, res);
        path.pop();
    }
    set
}

fn walk(v: &Value, dotted: &str, path: &mut Path, set: &mut FieldSet, res: &ResourceDef) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, c) in m {
                path.push(format!("f:{k}"));
                walk(c, &join(dotted, k), path, set, res);
                path.pop();
            }
        }
        Value::Array(items) => match ssa_list(res, dotted) {
            SsaList::Atomic => set.insert(path),
            SsaList::Set => {
                for item in items {
                    path.push(value_elem(item));
                    set.insert(path);
                    path.pop();
                }
            }
            SsaList::Map(keys) => {
                if items.iter().any(|i| key_elem(i, keys).is_none()) {
                    set.insert(path);
                    return;
                }
                for item in items {
                    let Some(elem) = key_elem(item, keys) else {
                        continue;
                    };
                    path.push(elem);
                    set.insert(path);
                    if let Some(m) = item.as_object() {
                        for (k, c) in m {
                            path.push(format!("f:{k}"));
                            walk(c, &join(dotted, k), path, set, res);
                            path.pop();
                        }
                    }
                    path.pop();
                }
            }
        },
        _ => set.insert(path),
    }
}

/// The fields `new` adds or changes relative to `old`.
pub(crate) fn changed_fields(
    old: Option<&Value>,
    new: &Value,
    res: &ResourceDef,
    scope: Scope,
) -> FieldSet {
    let old_top: BTreeMap<String, Value> = old
        .map(|o| {
            tracked_top(o, scope)
                .into_iter()
                .map(|(k, v)| (k.clone(), v))
                .collect()
        })
        .unwrap_or_default();
    let mut set = FieldSet::default();
    let mut path = Vec::new();
    for (k, v) in tracked_top(new, scope) {
        path.push(format!("f:{k}"));
        diff(old_top.get(k), &v, k, &mut path, &mut set, res);
        path.pop();
    }
    set
}

fn diff(
    old: Option<&Value>,
    new: &Value,
    dotted: &str,
    path: &mut Path,
    set: &mut FieldSet,
    res: &ResourceDef,
) {
    if old == Some(new) {
        return;
    }
    match (old, new) {
        (Some(Value::Object(o)), Value::Object(n)) if !n.is_empty() => {
            for (k, c) in n {
                path.push(format!("f:{k}"));
                diff(o.get(k), c, &join(dotted, k), path, set, res);
                path.pop();
            }
        }
        (Some(Value::Array(o)), Value::Array(n)) => match ssa_list(res, dotted) {
            SsaList::Atomic => set.insert(path),
            SsaList::Set => {
                for item in n.iter().filter(|i| !o.contains(i)) {
                    path.push(value_elem(item));
                    set.insert(path);
                    path.pop();
                }
            }
            SsaList::Map(keys) => {
                if n.iter()
                    .chain(o.iter())
                    .any(|i| key_elem(i, keys).is_none())
                {
                    set.insert(path);
                    return;
                }
                for item in n {
                    let Some(elem) = key_elem(item, keys) else {
                        continue;
                    };
                    let before = o.iter().find(|i| key_elem(i, keys).as_ref() == Some(&elem));
                    path.push(elem);
                    if before.is_none() {
                        set.insert(path);
                    }
                    if let Some(m) = item.as_object() {
                        for (k, c) in m {
                            path.push(format!("f:{k}"));
                            diff(
                                before.and_then(|b| b.get(k)),
                                c,
                                &join(dotted, k),
                                path,
                                set,
                                res,
                            );
                            path.pop();
                        }
                    }
                    path.pop();
                }
            }
        },
        _ => walk(new, dotted, path, set, res),
    }
}

/// Finds the value a path points at.
pub(crate) fn lookup<'a>(obj: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = obj;
    for elem in path {
        cur = step(cur, elem)?;
    }
    Some(cur)
}

fn item_matches(item: &Value, elem: &str) -> bool {
    if let Some(k) = elem.strip_prefix("k:") {
        let Ok(Value::Object(want)) = serde_json::from_str::<Value>(k) else {
            return false;
        };
        want.iter().all(|(wk, wv)| item.get(wk) == Some(wv))
    } else if let Some(v) = elem.strip_prefix("v:") {
        serde_json::from_str::<Value>(v).is_ok_and(|want| *item == want)
    } else {
        false
    }
}

fn step<'a>(cur: &'a Value, elem: &str) -> Option<&'a Value> {
    if let Some(f) = elem.strip_prefix("f:") {
        return cur.get(f);
    }
    cur.as_array()?.iter().find(|i| item_matches(i, elem))
}

/// Removes the value a path points at; containers this empties are
/// dropped too (below the top level), as Go's `omitempty` would.
fn remove_path(obj: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = &mut *obj;
    for elem in parents {
        let next = if let Some(f) = elem.strip_prefix("f:") {
            cur.get_mut(f)
        } else {
            cur.as_array_mut()
                .and_then(|a| a.iter_mut().find(|i| item_matches(i, elem)))
        };
        match next {
            Some(n) => cur = n,
            None => return,
        }
    }
    if let Some(f) = last.strip_prefix("f:") {
        if let Some(m) = cur.as_object_mut() {
            m.remove(f);
        }
    } else if let Some(a) = cur.as_array_mut() {
        a.retain(|i| !item_matches(i, last));
    }
    let now_empty = match cur {
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    };
    if now_empty && parents.len() >= 2 {
        remove_path(obj, parents);
    }
}

/// One `metadata.managedFields` entry.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    time: String,
    subresource: String,
    fields: FieldSet,
}

impl Entry {
    fn is(&self, manager: &str, operation: &str, subresource: &str) -> bool {
        self.manager == manager && self.operation == operation && self.subresource == subresource
    }

    /// The manager as the real conflict messages print it.
    fn describe(&self) -> String {
        let mut s = format!("{:?}", self.manager);
        if self.operation == "Update" {
            s.push_str(" with operation Update");
        }
        if !self.subresource.is_empty() {
            s.push_str(&format!(" with subresource {:?}", self.subresource));
        }
        s.push_str(&format!(" using {}", self.api_version));
        s
    }
}

fn parse_entries(obj: &Value) -> Vec<Entry> {
    let Some(list) = obj
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    list.iter()
        .map(|e| {
            let s = |k: &str| {
                e.get(k)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            Entry {
                manager: s("manager"),
                operation: s("operation"),
                api_version: s("apiVersion"),
                time: s("time"),
                subresource: s("subresource"),
                fields: e
                    .get("fieldsV1")
                    .map(FieldSet::from_fields_v1)
                    .unwrap_or_default(),
            }
        })
        .collect()
}

fn write_entries(obj: &mut Value, entries: Vec<Entry>) {
    let list: Vec<Value> = entries
        .into_iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut v = json!({
                "manager": e.manager,
                "operation": e.operation,
                "apiVersion": e.api_version,
                "time": e.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": e.fields.to_fields_v1(),
            });
            if !e.subresource.is_empty() {
                v["subresource"] = json!(e.subresource);
            }
            v
        })
        .collect();
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        if list.is_empty() {
            meta.remove("managedFields");
        } else {
            meta.insert("managedFields".into(), Value::Array(list));
        }
    }
}

/// Drops, from every entry, paths that no longer exist in `obj`.
fn prune_missing(entries: &mut [Entry], obj: &Value) {
    for e in entries.iter_mut() {
        for p in e.fields.members() {
            if lookup(obj, &p).is_none() {
                e.fields.remove(&p);
            }
        }
    }
}

/// Everything the ownership bookkeeping of one write needs.
pub(crate) struct WriteCtx<'a> {
    pub res: &'a ResourceDef,
    pub manager: &'a str,
    pub subresource: Option<&'a str>,
    pub now: &'a str,
}

/// Records a non-apply write (create, update, patch) by `ctx.manager` that
/// turns `old` into `new`: the manager's `Update` entry gains the fields it
/// changed, which every other manager loses. `new` must already carry the
/// entries to start from in `metadata.managedFields`.
pub(crate) fn record_update(old: Option<&Value>, new: &mut Value, ctx: &WriteCtx<'_>) {
    let scope = Scope::of(ctx.res, ctx.subresource);
    let changed = changed_fields(old, new, ctx.res, scope);
    let sub = ctx.subresource.unwrap_or_default();
    let mut entries = parse_entries(new);
    for e in entries
        .iter_mut()
        .filter(|e| !e.is(ctx.manager, "Update", sub))
    {
        e.fields.difference(&changed);
    }
    if !changed.is_empty() {
        match entries
            .iter_mut()
            .find(|e| e.is(ctx.manager, "Update", sub))
        {
            Some(own) => {
                let before = own.fields.clone();
                own.fields.union(&changed);
                if own.fields != before {
                    own.time = ctx.now.to_string();
                }
            }
            None => entries.push(Entry {
                manager: ctx.manager.to_string(),
                operation: "Update".into(),
                api_version: ctx.res.api_version(),
                time: ctx.now.to_string(),
                subresource: sub.to_string(),
                fields: changed,
            }),
        }
    }
    prune_missing(&mut entries, new);
    write_entries(new, entries);
}

/// Merges an applied configuration into the live object with the list
/// semantics of server-side apply.
fn apply_merge(live: &mut Value, applied: &Value, dotted: &str, res: &ResourceDef) {
    match (live, applied) {
        (Value::Object(l), Value::Object(a)) => {
            for (k, v) in a {
                let child = join(dotted, k);
                if v.is_null() {
                    l.remove(k);
                    continue;
                }
                match l.get_mut(k) {
                    Some(existing)
                        if (existing.is_object() && v.is_object())
                            || (existing.is_array() && v.is_array()) =>
                    {
                        apply_merge(existing, v, &child, res)
                    }
                    _ => {
                        let mut fresh = if v.is_object() { json!({}) } else { json!([]) };
                        if v.is_object() || v.is_array() {
                            apply_merge(&mut fresh, v, &child, res);
                            l.insert(k.clone(), fresh);
                        } else {
                            l.insert(k.clone(), v.clone());
                        }
                    }
                }
            }
        }
        (Value::Array(l), Value::Array(a)) => match ssa_list(res, dotted) {
            SsaList::Atomic => *l = a.clone(),
            SsaList::Set => {
                for item in a {
                    if !l.contains(item) {
                        l.push(item.clone());
                    }
                }
            }
            SsaList::Map(keys) => {
                if a.iter()
                    .chain(l.iter())
                    .any(|i| key_elem(i, keys).is_none())
                {
                    *l = a.clone();
                    return;
                }
                for item in a {
                    let elem = key_elem(item, keys);
                    match l.iter_mut().find(|i| key_elem(i, keys) == elem) {
                        Some(existing) => apply_merge(existing, item, dotted, res),
                        None => l.push(item.clone()),
                    }
                }
            }
        },
        (live, applied) => *live = applied.clone(),
    }
}

/// A path printed as the real conflict messages print it: `.spec.x`,
/// `.status.conditions[type="Ready"].status`, `.metadata.finalizers[="a"]`.
pub(crate) fn path_string(path: &[String]) -> String {
    let mut s = String::new();
    for elem in path {
        if let Some(f) = elem.strip_prefix("f:") {
            s.push('.');
            s.push_str(f);
        } else if let Some(k) = elem.strip_prefix("k:") {
            let parts: Vec<String> = match serde_json::from_str::<Value>(k) {
                Ok(Value::Object(m)) => m.iter().map(|(k, v)| format!("{k}={v}")).collect(),
                _ => vec![k.to_string()],
            };
            s.push_str(&format!("[{}]", parts.join(",")));
        } else if let Some(v) = elem.strip_prefix("v:") {
            s.push_str(&format!("[={v}]"));
        }
    }
    s
}

/// Server-side apply of `applied` by `ctx.manager` onto `live` (None: the
/// object does not exist yet and `skeleton` is its identity). Returns the
/// new object with its managedFields, or a 409 naming the conflicts.
pub(crate) fn apply(
    live: Option<&Value>,
    skeleton: Value,
    applied: &Value,
    force: bool,
    ctx: &WriteCtx<'_>,
    name: &str,
) -> Result<Value, ApiError> {
    let scope = Scope::of(ctx.res, ctx.subresource);
    let sub = ctx.subresource.unwrap_or_default();
    let base = live.cloned().unwrap_or(skeleton);

    // Only the part of the configuration this endpoint may write counts.
    let mut scoped = applied.clone();
    if let Some(m) = scoped.as_object_mut() {
        m.retain(|k, _| UNTRACKED_TOP.contains(&k.as_str()) || scope.keeps(k));
        if let Some(meta) = m.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.retain(|k, _| !UNTRACKED_META.contains(&k.as_str()));
        }
        m.remove("apiVersion");
        m.remove("kind");
    }
    let applied_set = object_fields(&scoped, ctx.res, scope);
    let mut merged = base.clone();
    apply_merge(&mut merged, &scoped, "", ctx.res);

    let mut entries = parse_entries(&base);
    let changed = changed_fields(Some(&base), &merged, ctx.res, scope);
    let contested = changed.intersection(&applied_set);
    let mut conflicts: Vec<(usize, Vec<Path>)> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        if e.is(ctx.manager, "Apply", sub) {
            continue;
        }
        let paths = e.fields.intersection(&contested).members();
        if !paths.is_empty() {
            conflicts.push((i, paths));
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflict_error(ctx.res, name, &entries, &conflicts));
    }
    for (i, paths) in &conflicts {
        if let Some(e) = entries.get_mut(*i) {
            for p in paths {
                e.fields.remove(p);
            }
        }
    }

    // Fields this manager applied before and omits now go away unless
    // someone else still owns them (or something beneath them).
    let own = entries.iter().position(|e| e.is(ctx.manager, "Apply", sub));
    if let Some(own) = own {
        let mut dropped = entries[own].fields.clone();
        dropped.difference(&applied_set);
        let mut paths = dropped.members();
        paths.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for p in paths {
            let kept = entries
                .iter()
                .enumerate()
                .any(|(i, e)| i != own && e.fields.covers(&p));
            if !kept {
                remove_path(&mut merged, &p);
            }
        }
    }

    match own {
        Some(own) => {
            let e = &mut entries[own];
            if e.fields != applied_set || merged != base {
                e.time = ctx.now.to_string();
            }
            e.fields = applied_set;
        }
        None => entries.push(Entry {
            manager: ctx.manager.to_string(),
            operation: "Apply".into(),
            api_version: ctx.res.api_version(),
            time: ctx.now.to_string(),
            subresource: sub.to_string(),
            fields: applied_set,
        }),
    }
    prune_missing(&mut entries, &merged);
    write_entries(&mut merged, entries);
    Ok(merged)
}

fn conflict_error(
    res: &ResourceDef,
    name: &str,
    entries: &[Entry],
    conflicts: &[(usize, Vec<Path>)],
) -> ApiError {
    let total: usize = conflicts.iter().map(|(_, p)| p.len()).sum();
    let mut causes = Vec::new();
    for (i, paths) in conflicts {
        let who = entries.get(*i).map(Entry::describe).unwrap_or_default();
        for p in paths {
            causes.push(Cause {
                reason: "FieldManagerConflict",
                message: format!("conflict with {who}"),
                field: path_string(p),
            });
        }
    }
    let body = if total == 1 {
        causes
            .first()
            .map(|c| format!("{}: {}", c.message, c.field))
            .unwrap_or_default()
    } else if conflicts.len() == 1 {
        let who = entries
            .get(conflicts[0].0)
            .map(Entry::describe)
            .unwrap_or_default();
        let lines: Vec<String> = conflicts[0]
            .1
            .iter()
            .map(|p| format!("- {}", path_string(p)))
            .collect();
        format!("conflicts with {who}:\n{}", lines.join("\n"))
    } else {
        let mut s = "conflicts with".to_string();
        for (i, paths) in conflicts {
            let who = entries.get(*i).map(Entry::describe).unwrap_or_default();
            s.push_str(&format!("\n{who}:"));
            for p in paths {
                s.push_str(&format!("\n- {}", path_string(p)));
            }
        }
        s
    };
    let plural = if total == 1 { "conflict" } else { "conflicts" };
    ApiError::apply_conflict(
        res,
        name,
        format!("Apply failed with {total} {plural}: {body}"),
        causes,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources::{RESOURCES, find};

    fn nodes() -> &'static ResourceDef {
        &RESOURCES[find("", "v1", "nodes").unwrap_or(0)]
    }

    fn ctx<'a>(manager: &'a str, sub: Option<&'a str>) -> WriteCtx<'a> {
        WriteCtx {
            res: nodes(),
            manager,
            subresource: sub,
            now: "2024-01-01T00:00:00Z",
        }
    }

    #[test]
    fn apiserver_fields_v1_round_trip_and_keys() {
        let node = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n", "labels": {"a": "1"}, "finalizers": ["x"]},
            "spec": {"taints": [{"key": "k"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        });
        let set = object_fields(&node, nodes(), Scope::All);
        let v1 = set.to_fields_v1();
        assert_eq!(
            v1,
            json!({
                "f:metadata": {"f:labels": {"f:a": {}}, "f:finalizers": {"v:\"x\"": {}}},
                "f:spec": {"f:taints": {}},
                "f:status": {"f:conditions": {"k:{\"type\":\"Ready\"}": {".": {}, "f:status": {}, "f:type": {}}}},
            })
        );
        assert_eq!(FieldSet::from_fields_v1(&v1), set);
        let p: Path = vec![
            "f:status".into(),
            "f:conditions".into(),
            "k:{\"type\":\"Ready\"}".into(),
            "f:status".into(),
        ];
        assert_eq!(lookup(&node, &p), Some(&json!("True")));
        assert_eq!(path_string(&p), ".status.conditions[type=\"Ready\"].status");
    }

    #[test]
    fn apiserver_apply_conflicts_force_and_removal() {
        let skeleton = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}});
        let first = apply(
            None,
            skeleton.clone(),
            &json!({"metadata": {"labels": {"a": "1", "b": "1"}}}),
            false,
            &ctx("m1", None),
            "n",
        );
        let first = first.unwrap_or_default();
        assert_eq!(first["metadata"]["labels"], json!({"a": "1", "b": "1"}));
        // Same value from another manager: shared ownership, no conflict.
        let shared = apply(
            Some(&first),
            skeleton.clone(),
            &json!({"metadata": {"labels": {"a": "1"}}}),
            false,
            &ctx("m2", None),
            "n",
        );
        assert!(shared.is_ok());
        // A different value conflicts and names the owner.
        let err = apply(
            Some(&first),
            skeleton.clone(),
            &json!({"metadata": {"labels": {"b": "2"}}}),
            false,
            &ctx("m2", None),
            "n",
        );
        let err = err.err().map(|e| (e.code, e.message)).unwrap_or_default();
        assert_eq!(err.0, 409);
        assert_eq!(
            err.1,
            "Apply failed with 1 conflict: conflict with \"m1\" using v1: .metadata.labels.b"
        );
        // Forcing takes ownership away from m1.
        let forced = apply(
            Some(&first),
            skeleton.clone(),
            &json!({"metadata": {"labels": {"b": "2"}}}),
            true,
            &ctx("m2", None),
            "n",
        )
        .unwrap_or_default();
        assert_eq!(forced["metadata"]["labels"]["b"], "2");
        let m1 = parse_entries(&forced)
            .into_iter()
            .find(|e| e.manager == "m1")
            .map(|e| e.fields.to_fields_v1());
        assert_eq!(m1, Some(json!({"f:metadata": {"f:labels": {"f:a": {}}}})));
        // m1 now omits a: nobody else owns it, so it is removed.
        let dropped = apply(
            Some(&forced),
            skeleton,
            &json!({"metadata": {}}),
            false,
            &ctx("m1", None),
            "n",
        )
        .unwrap_or_default();
        assert_eq!(dropped["metadata"]["labels"], json!({"b": "2"}));
        assert!(parse_entries(&dropped).iter().all(|e| e.manager != "m1"));
    }

    #[test]
    fn apiserver_update_takes_ownership() {
        let old = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}, "spec": {"unschedulable": false}});
        let mut created = old.clone();
        record_update(None, &mut created, &ctx("creator", None));
        let mut new = created.clone();
        new["spec"]["unschedulable"] = json!(true);
        new["spec"]["providerID"] = json!("aws:///x");
        record_update(Some(&created), &mut new, &ctx("updater", None));
        let entries = parse_entries(&new);
        assert_eq!(entries.len(), 1, "{entries:?}");
        assert_eq!(entries[0].manager, "updater");
        assert_eq!(entries[0].fields.members().len(), 2);
    }
}
