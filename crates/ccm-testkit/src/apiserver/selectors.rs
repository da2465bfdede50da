//! Label and field selectors, parsed as the real server parses them and
//! matched against stored JSON objects.

use std::collections::BTreeSet;

use serde_json::Value;

use super::errors::ApiError;
use super::resources::ResourceDef;

#[derive(Debug, Clone, PartialEq)]
enum Op {
    Exists,
    DoesNotExist,
    Equals(String),
    NotEquals(String),
    In(BTreeSet<String>),
    NotIn(BTreeSet<String>),
    Gt(i64),
    Lt(i64),
}

#[derive(Debug, Clone, PartialEq)]
struct Requirement {
    key: String,
    op: Op,
}

/// A parsed `labelSelector`; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct LabelSelector {
    reqs: Vec<Requirement>,
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Not,
    Eq,
    DoubleEq,
    NotEq,
    Open,
    Close,
    Comma,
    Gt,
    Lt,
}

fn lex(s: &str) -> Result<Vec<Tok>, String> {
    let mut out = Vec::new();
    let chars: Vec<char> = s.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            c if c.is_whitespace() => i += 1,
            '(' => {
                out.push(Tok::Open);
                i += 1
            }
            ')' => {
                out.push(Tok::Close);
                i += 1
            }
            ',' => {
                out.push(Tok::Comma);
                i += 1
            }
            '>' => {
                out.push(Tok::Gt);
                i += 1
            }
            '<' => {
                out.push(Tok::Lt);
                i += 1
            }
            '=' => {
                if chars.get(i + 1) == Some(&'=') {
                    out.push(Tok::DoubleEq);
                    i += 2
                } else {
                    out.push(Tok::Eq);
                    i += 1
                }
            }
            '!' => {
                if chars.get(i + 1) == Some(&'=') {
                    out.push(Tok::NotEq);
                    i += 2
                } else {
                    out.push(Tok::Not);
                    i += 1
                }
            }
            _ => {
                let start = i;
                while i < chars.len() && !chars[i].is_whitespace() && !"(),<>=!".contains(chars[i])
                {
                    i += 1;
                }
                out.push(Tok::Ident(chars[start..i].iter().collect()));
            }
        }
    }
    Ok(out)
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 317
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
        && k.matches('/').count() <= 1
}

fn valid_value(v: &str) -> bool {
    v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

impl LabelSelector {
    /// Parses the selector syntax of `labels.Parse`: `k`, `!k`, `k=v`,
    /// `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k>1`, `k<1`.
    pub fn parse(s: &str) -> Result<LabelSelector, ApiError> {
        Self::parse_inner(s).map_err(|e| {
            ApiError::bad_request(format!("unable to parse requirement: {e} (selector {s:?})"))
        })
    }

    fn parse_inner(s: &str) -> Result<LabelSelector, String> {
        let toks = lex(s)?;
        let mut reqs = Vec::new();
        let mut i = 0;
        let ident = |i: usize| -> Option<String> {
            match toks.get(i) {
                Some(Tok::Ident(s)) => Some(s.clone()),
                _ => None,
            }
        };
        while i < toks.len() {
            let req = if toks[i] == Tok::Not {
                let key = ident(i + 1).ok_or("expected a key after '!'")?;
                i += 2;
                Requirement {
                    key,
                    op: Op::DoesNotExist,
                }
            } else {
                let key = ident(i).ok_or_else(|| format!("expected a key at token {}", i + 1))?;
                i += 1;
                match toks.get(i) {
                    None | Some(Tok::Comma) => Requirement {
                        key,
                        op: Op::Exists,
                    },
                    Some(Tok::Eq) | Some(Tok::DoubleEq) | Some(Tok::NotEq) => {
                        let negate = toks[i] == Tok::NotEq;
                        i += 1;
                        let value = match ident(i) {
                            Some(v) => {
                                i += 1;
                                v
                            }
                            None => String::new(),
                        };
                        if !valid_value(&value) {
                            return Err(format!("invalid label value: {value:?}"));
                        }
                        let op = if negate {
                            Op::NotEquals(value)
                        } else {
                            Op::Equals(value)
                        };
                        Requirement { key, op }
                    }
                    Some(Tok::Gt) | Some(Tok::Lt) => {
                        let gt = toks[i] == Tok::Gt;
                        let v = ident(i + 1).ok_or("expected an integer after '<' or '>'")?;
                        let n: i64 = v.parse().map_err(|_| format!("{v:?} is not an integer"))?;
                        i += 2;
                        Requirement {
                            key,
                            op: if gt { Op::Gt(n) } else { Op::Lt(n) },
                        }
                    }
                    Some(Tok::Ident(word)) if word == "in" || word == "notin" => {
                        let is_in = word == "in";
                        i += 1;
                        if toks.get(i) != Some(&Tok::Open) {
                            return Err(format!("expected '(' after '{word}'"));
                        }
                        i += 1;
                        let mut values = BTreeSet::new();
                        loop {
                            match toks.get(i) {
                                Some(Tok::Ident(v)) => {
                                    if !valid_value(v) {
                                        return Err(format!("invalid label value: {v:?}"));
                                    }
                                    values.insert(v.clone());
                                    i += 1;
                                }
                                Some(Tok::Comma) => {
                                    i += 1;
                                }
                                Some(Tok::Close) => {
                                    i += 1;
                                    break;
                                }
                                _ => return Err("expected ')' to close the value set".into()),
                            }
                        }
                        if values.is_empty() {
                            return Err(
                                "for 'in' and 'notin' operators, values set can't be empty".into(),
                            );
                        }
                        Requirement {
                            key,
                            op: if is_in {
                                Op::In(values)
                            } else {
                                Op::NotIn(values)
                            },
                        }
                    }
                    Some(t) => return Err(format!("unexpected {t:?} after key {key:?}")),
                }
            };
            if !valid_key(&req.key) {
                return Err(format!("invalid label key {:?}", req.key));
            }
            reqs.push(req);
            match toks.get(i) {
                None => break,
                Some(Tok::Comma) => i += 1,
                Some(t) => return Err(format!("expected ',' but found {t:?}")),
            }
        }
        Ok(LabelSelector { reqs })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// Whether the object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.reqs.iter().all(|r| match &r.op {
            Op::Exists => get(&r.key).is_some(),
            Op::DoesNotExist => get(&r.key).is_none(),
            Op::Equals(v) => get(&r.key) == Some(v.as_str()),
            Op::NotEquals(v) => get(&r.key) != Some(v.as_str()),
            Op::In(set) => get(&r.key).is_some_and(|v| set.contains(v)),
            Op::NotIn(set) => get(&r.key).is_none_or(|v| !set.contains(v)),
            Op::Gt(n) => get(&r.key)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v > *n),
            Op::Lt(n) => get(&r.key)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v < *n),
        })
    }
}

/// A parsed `fieldSelector`, checked against the resource's supported labels.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct FieldSelector {
    /// (JSON path, wanted value, equal?)
    terms: Vec<(&'static str, String, bool)>,
}

/// Boolean fields the Go types always render, so a missing one reads "false".
const BOOL_FIELDS: &[&str] = &["spec.unschedulable", "spec.hostNetwork"];

impl FieldSelector {
    pub fn parse(s: &str, res: &ResourceDef) -> Result<FieldSelector, ApiError> {
        let mut terms = Vec::new();
        for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (label, value, eq) = if let Some((l, v)) = term.split_once("!=") {
                (l, v, false)
            } else if let Some((l, v)) = term.split_once("==") {
                (l, v, true)
            } else if let Some((l, v)) = term.split_once('=') {
                (l, v, true)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{term}'"
                )));
            };
            let label = label.trim();
            let path = res.field_path(label).ok_or_else(|| {
                ApiError::bad_request(format!("field label not supported: {label}"))
            })?;
            terms.push((path, value.trim().to_string(), eq));
        }
        Ok(FieldSelector { terms })
    }

    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.terms.iter().all(|(path, want, eq)| {
            let got = field_value(obj, path);
            (got == *want) == *eq
        })
    }
}

/// The string form of a field, as the Go field sets render it.
fn field_value(obj: &Value, path: &str) -> String {
    let mut cur = Some(obj);
    for seg in path.split('.') {
        cur = cur.and_then(|v| v.get(seg));
    }
    match cur {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        _ if BOOL_FIELDS.contains(&path) => "false".to_string(),
        _ => String::new(),
    }
}

/// Both selectors of a list or watch request.
#[derive(Debug, Clone, Default)]
pub(crate) struct Selectors {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Selectors {
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources::{RESOURCES, find};
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "labels": labels}, "spec": {"nodeName": "n1"}})
    }

    #[test]
    fn apiserver_label_selector_operators() {
        let o = obj(json!({"app": "web", "tier": "front", "n": "5"}));
        let cases = [
            ("", true),
            ("app", true),
            ("!app", false),
            ("!missing", true),
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("missing!=x", true),
            ("app in (web, db)", true),
            ("app in (db)", false),
            ("app notin (db)", true),
            ("missing notin (db)", true),
            ("missing in (db)", false),
            ("app=web,tier=front", true),
            ("app=web,tier=back", false),
            ("n>4", true),
            ("n<4", false),
            ("app in (web),!missing", true),
        ];
        for (sel, want) in cases {
            let parsed = LabelSelector::parse(sel);
            assert!(parsed.is_ok(), "{sel}: {parsed:?}");
            assert_eq!(parsed.map(|p| p.matches(&o)).ok(), Some(want), "{sel}");
        }
    }

    #[test]
    fn apiserver_label_selector_rejects_garbage() {
        for sel in ["app in web", "app in ()", "=x", "a=b c", "a in (x", "a>b"] {
            let err = LabelSelector::parse(sel).err().map(|e| e.code);
            assert_eq!(err, Some(400), "{sel}");
        }
    }

    #[test]
    fn apiserver_field_selectors() {
        let pods = &RESOURCES[find("", "v1", "pods").unwrap_or(0)];
        let o = obj(json!({}));
        let sel = FieldSelector::parse("spec.nodeName=n1,metadata.name!=b", pods);
        assert_eq!(sel.map(|s| s.matches(&o)).ok(), Some(true));
        let err = FieldSelector::parse("spec.bogus=1", pods).err();
        assert_eq!(
            err.map(|e| (e.code, e.message)),
            Some((400, "field label not supported: spec.bogus".into()))
        );
        let nodes = &RESOURCES[find("", "v1", "nodes").unwrap_or(0)];
        let sel = FieldSelector::parse("spec.unschedulable=false", nodes);
        assert_eq!(sel.map(|s| s.matches(&o)).ok(), Some(true));
    }
}
