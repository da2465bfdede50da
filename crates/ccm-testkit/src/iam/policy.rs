//! IAM policy documents and their evaluation, as AWS documents it ("Policy
//! evaluation logic" and "IAM JSON policy elements: Condition operators").
//!
//! Strict on purpose: an element or operator this evaluator does not know is
//! a parse error, never ignored; a single-valued operator on a key with more
//! than one value does not match; an absent key matches only `Null: true`,
//! the negated string operators, `ForAllValues:` and `…IfExists`, exactly as
//! AWS evaluates them.

use std::collections::BTreeMap;

use serde_json::Value;

/// What AWS decides for one action on one resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// An Allow statement applied (its Sid) and no Deny did.
    Allow(String),
    /// A Deny statement applied (its Sid).
    ExplicitDeny(String),
    /// No statement applied.
    ImplicitDeny,
}

impl Decision {
    pub fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allow(_))
    }
}

/// The request context: condition keys (compared case-insensitively, as
/// IAM does) and their values. A key with several values (`aws:TagKeys`)
/// is multivalued.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Context {
    values: BTreeMap<String, Vec<String>>,
}

impl Context {
    pub fn set(&mut self, key: &str, value: impl Into<String>) {
        self.values
            .insert(key.to_ascii_lowercase(), vec![value.into()]);
    }

    pub fn set_many(&mut self, key: &str, values: Vec<String>) {
        self.values.insert(key.to_ascii_lowercase(), values);
    }

    pub fn get(&self, key: &str) -> Option<&[String]> {
        self.values
            .get(&key.to_ascii_lowercase())
            .map(Vec::as_slice)
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.values.keys().map(String::as_str)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Operator {
    StringEquals,
    StringNotEquals,
    StringEqualsIgnoreCase,
    StringNotEqualsIgnoreCase,
    StringLike,
    StringNotLike,
    ArnEquals,
    ArnLike,
    ArnNotEquals,
    ArnNotLike,
    Bool,
    Null,
}

impl Operator {
    fn parse(name: &str) -> Option<Operator> {
        Some(match name {
            "StringEquals" => Operator::StringEquals,
            "StringNotEquals" => Operator::StringNotEquals,
            "StringEqualsIgnoreCase" => Operator::StringEqualsIgnoreCase,
            "StringNotEqualsIgnoreCase" => Operator::StringNotEqualsIgnoreCase,
            "StringLike" => Operator::StringLike,
            "StringNotLike" => Operator::StringNotLike,
            "ArnEquals" => Operator::ArnEquals,
            "ArnLike" => Operator::ArnLike,
            "ArnNotEquals" => Operator::ArnNotEquals,
            "ArnNotLike" => Operator::ArnNotLike,
            "Bool" => Operator::Bool,
            "Null" => Operator::Null,
            _ => return None,
        })
    }

    fn negated(self) -> bool {
        matches!(
            self,
            Operator::StringNotEquals
                | Operator::StringNotEqualsIgnoreCase
                | Operator::StringNotLike
                | Operator::ArnNotEquals
                | Operator::ArnNotLike
        )
    }

    /// Whether one request value matches one policy value, before negation.
    fn matches(self, policy: &str, value: &str) -> bool {
        match self {
            Operator::StringEquals
            | Operator::StringNotEquals
            | Operator::ArnEquals
            | Operator::ArnNotEquals => policy == value,
            Operator::StringEqualsIgnoreCase | Operator::StringNotEqualsIgnoreCase => {
                policy.eq_ignore_ascii_case(value)
            }
            Operator::StringLike
            | Operator::StringNotLike
            | Operator::ArnLike
            | Operator::ArnNotLike => glob(policy, value),
            Operator::Bool => policy.eq_ignore_ascii_case(value),
            Operator::Null => false,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SetQualifier {
    Single,
    ForAllValues,
    ForAnyValue,
}

#[derive(Clone, Debug)]
struct Condition {
    operator: Operator,
    set: SetQualifier,
    if_exists: bool,
    key: String,
    values: Vec<String>,
}

impl Condition {
    fn holds(&self, context: &Context) -> bool {
        let present = context.get(&self.key).filter(|v| !v.is_empty());
        if self.operator == Operator::Null {
            return self.values.iter().any(|want| {
                let want_absent = want.eq_ignore_ascii_case("true");
                present.is_none() == want_absent
            });
        }
        let Some(values) = present else {
            return self.if_exists
                || match self.set {
                    SetQualifier::ForAllValues => true,
                    SetQualifier::ForAnyValue => false,
                    SetQualifier::Single => self.operator.negated(),
                };
        };
        match self.set {
            SetQualifier::Single => values.len() == 1 && self.one(&values[0]),
            SetQualifier::ForAllValues => values.iter().all(|v| self.one(v)),
            SetQualifier::ForAnyValue => values.iter().any(|v| self.one(v)),
        }
    }

    /// One request value against the condition's policy values: any of
    /// them for a positive operator, none of them for a negated one.
    fn one(&self, value: &str) -> bool {
        let any = self.values.iter().any(|p| self.operator.matches(p, value));
        any != self.operator.negated()
    }
}

#[derive(Clone, Debug)]
enum Patterns {
    Listed(Vec<String>),
    AllBut(Vec<String>),
}

impl Patterns {
    fn matches(&self, value: &str, case_insensitive: bool) -> bool {
        let hit = |list: &[String]| {
            list.iter().any(|p| {
                if case_insensitive {
                    glob(&p.to_ascii_lowercase(), &value.to_ascii_lowercase())
                } else {
                    glob(p, value)
                }
            })
        };
        match self {
            Patterns::Listed(list) => hit(list),
            Patterns::AllBut(list) => !hit(list),
        }
    }
}

#[derive(Clone, Debug)]
struct Statement {
    sid: String,
    allow: bool,
    actions: Patterns,
    resources: Patterns,
    conditions: Vec<Condition>,
}

impl Statement {
    fn applies(&self, action: &str, resource: &str, context: &Context) -> bool {
        self.actions.matches(action, true)
            && self.resources.matches(resource, false)
            && self.conditions.iter().all(|c| c.holds(context))
    }
}

/// A parsed identity policy.
#[derive(Clone, Debug)]
pub struct Policy {
    statements: Vec<Statement>,
}

impl Policy {
    pub fn parse(text: &str) -> Result<Policy, String> {
        let doc: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        if doc["Version"] != "2012-10-17" {
            return Err(
                "Version must be 2012-10-17 (older versions disable policy variables)".into(),
            );
        }
        let statements = match &doc["Statement"] {
            Value::Array(list) => list.iter().collect::<Vec<_>>(),
            one @ Value::Object(_) => vec![one],
            _ => return Err("Statement must be an object or a list".into()),
        };
        let statements = statements
            .into_iter()
            .enumerate()
            .map(|(i, s)| parse_statement(i, s))
            .collect::<Result<_, _>>()?;
        Ok(Policy { statements })
    }

    /// AWS's decision: an explicit Deny wins, then any Allow, else deny.
    pub fn evaluate(&self, action: &str, resource: &str, context: &Context) -> Decision {
        let applying = || {
            self.statements
                .iter()
                .filter(|s| s.applies(action, resource, context))
        };
        if let Some(deny) = applying().find(|s| !s.allow) {
            return Decision::ExplicitDeny(deny.sid.clone());
        }
        match applying().find(|s| s.allow) {
            Some(allow) => Decision::Allow(allow.sid.clone()),
            None => Decision::ImplicitDeny,
        }
    }

    /// The condition keys that the statements applying to `action` on
    /// `resource` test and `context` has no value for, spelled as the
    /// policy spells them, each once: what IAM's policy simulator reports
    /// as `MissingContextValues`.
    pub fn missing_context_keys(
        &self,
        action: &str,
        resource: &str,
        context: &Context,
    ) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let statements = self
            .statements
            .iter()
            .filter(|s| s.actions.matches(action, true) && s.resources.matches(resource, false));
        for condition in statements.flat_map(|s| &s.conditions) {
            let absent = context.get(&condition.key).is_none_or(<[String]>::is_empty);
            if absent && !out.iter().any(|k| k.eq_ignore_ascii_case(&condition.key)) {
                out.push(condition.key.clone());
            }
        }
        out
    }

    /// Every action pattern the Allow statements list.
    pub fn allowed_action_patterns(&self) -> Vec<String> {
        self.statements
            .iter()
            .filter(|s| s.allow)
            .filter_map(|s| match &s.actions {
                Patterns::Listed(list) => Some(list.clone()),
                Patterns::AllBut(_) => None,
            })
            .flatten()
            .collect()
    }
}

const STATEMENT_FIELDS: &[&str] = &[
    "Sid",
    "Effect",
    "Action",
    "NotAction",
    "Resource",
    "NotResource",
    "Condition",
];

fn parse_statement(index: usize, s: &Value) -> Result<Statement, String> {
    let sid = s["Sid"].as_str().unwrap_or_default().to_string();
    let name = if sid.is_empty() {
        format!("#{index}")
    } else {
        sid.clone()
    };
    let object = s.as_object().ok_or(format!("{name}: not an object"))?;
    if let Some(unknown) = object
        .keys()
        .find(|k| !STATEMENT_FIELDS.contains(&k.as_str()))
    {
        return Err(format!(
            "{name}: element {unknown} is not supported (Principal belongs in resource policies)"
        ));
    }
    let allow = match s["Effect"].as_str() {
        Some("Allow") => true,
        Some("Deny") => false,
        other => {
            return Err(format!(
                "{name}: Effect {other:?} is neither Allow nor Deny"
            ));
        }
    };
    let actions = patterns(s, "Action", "NotAction").map_err(|e| format!("{name}: {e}"))?;
    let resources = patterns(s, "Resource", "NotResource").map_err(|e| format!("{name}: {e}"))?;
    let conditions = match s.get("Condition") {
        None => Vec::new(),
        Some(c) => parse_conditions(c).map_err(|e| format!("{name}: {e}"))?,
    };
    Ok(Statement {
        sid: name,
        allow,
        actions,
        resources,
        conditions,
    })
}

fn strings(v: &Value) -> Result<Vec<String>, String> {
    match v {
        Value::String(s) => Ok(vec![s.clone()]),
        Value::Bool(b) => Ok(vec![b.to_string()]),
        Value::Array(list) => list
            .iter()
            .map(|x| match x {
                Value::String(s) => Ok(s.clone()),
                Value::Bool(b) => Ok(b.to_string()),
                other => Err(format!("{other} is not a string")),
            })
            .collect(),
        other => Err(format!("{other} is not a string or a list of strings")),
    }
}

fn patterns(s: &Value, positive: &str, negative: &str) -> Result<Patterns, String> {
    match (s.get(positive), s.get(negative)) {
        (Some(v), None) => Ok(Patterns::Listed(strings(v)?)),
        (None, Some(v)) => Ok(Patterns::AllBut(strings(v)?)),
        _ => Err(format!(
            "exactly one of {positive} and {negative} is required"
        )),
    }
}

fn parse_conditions(c: &Value) -> Result<Vec<Condition>, String> {
    let blocks = c.as_object().ok_or("Condition is not an object")?;
    let mut out = Vec::new();
    for (name, keys) in blocks {
        let (set, rest) = if let Some(rest) = name.strip_prefix("ForAllValues:") {
            (SetQualifier::ForAllValues, rest)
        } else if let Some(rest) = name.strip_prefix("ForAnyValue:") {
            (SetQualifier::ForAnyValue, rest)
        } else {
            (SetQualifier::Single, name.as_str())
        };
        let (base, if_exists) = match rest.strip_suffix("IfExists") {
            Some(base) => (base, true),
            None => (rest, false),
        };
        let operator = Operator::parse(base).ok_or(format!("unknown condition operator {name}"))?;
        if operator == Operator::Null && (if_exists || set != SetQualifier::Single) {
            return Err(format!("{name}: Null takes no qualifier"));
        }
        let keys = keys.as_object().ok_or(format!("{name} is not an object"))?;
        for (key, values) in keys {
            out.push(Condition {
                operator,
                set,
                if_exists,
                key: key.clone(),
                values: strings(values).map_err(|e| format!("{name} {key}: {e}"))?,
            });
        }
    }
    Ok(out)
}

/// IAM's wildcard match: `*` any run of characters (slashes included), `?`
/// exactly one.
pub fn glob(pattern: &str, value: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let v: Vec<char> = value.chars().collect();
    let (mut pi, mut vi) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while vi < v.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == v[vi]) {
            pi += 1;
            vi += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, vi));
            pi += 1;
        } else if let Some((sp, sv)) = star {
            pi = sp + 1;
            vi = sv + 1;
            star = Some((sp, sv + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(pairs: &[(&str, &[&str])]) -> Context {
        let mut c = Context::default();
        for (k, v) in pairs {
            c.set_many(k, v.iter().map(|s| s.to_string()).collect());
        }
        c
    }

    fn policy(statement: &str) -> Policy {
        Policy::parse(&format!(
            r#"{{"Version":"2012-10-17","Statement":[{statement}]}}"#
        ))
        .expect("policy parses")
    }

    #[test]
    fn wildcards_cross_slashes_and_question_marks_take_one() {
        assert!(glob(
            "arn:aws:elasticloadbalancing:*:*:loadbalancer/*",
            "arn:aws:elasticloadbalancing:us-east-1:1:loadbalancer/net/a/b"
        ));
        assert!(glob("a?c", "abc"));
        assert!(!glob("a?c", "ac"));
        assert!(!glob("kubernetes.io/cluster/*", "KubernetesCluster"));
        assert!(glob("*", ""));
    }

    #[test]
    fn deny_wins_and_nothing_matching_is_an_implicit_deny() {
        let p = policy(
            r#"{"Sid":"A","Effect":"Allow","Action":"ec2:*","Resource":"*"},
               {"Sid":"D","Effect":"Deny","Action":"ec2:DeleteRoute","Resource":"*"}"#,
        );
        let c = Context::default();
        assert_eq!(
            p.evaluate("ec2:CreateRoute", "x", &c),
            Decision::Allow("A".into())
        );
        assert_eq!(
            p.evaluate("EC2:deleteroute", "x", &c),
            Decision::ExplicitDeny("D".into())
        );
        assert_eq!(
            p.evaluate("elasticloadbalancing:AddTags", "x", &c),
            Decision::ImplicitDeny
        );
    }

    #[test]
    fn an_absent_key_fails_positive_operators_and_passes_negated_ones() {
        let eq = policy(
            r#"{"Effect":"Allow","Action":"*","Resource":"*","Condition":{"StringEquals":{"aws:RequestTag/k":"v"}}}"#,
        );
        let ne = policy(
            r#"{"Effect":"Allow","Action":"*","Resource":"*","Condition":{"StringNotEquals":{"aws:RequestTag/k":"v"}}}"#,
        );
        let if_exists = policy(
            r#"{"Effect":"Allow","Action":"*","Resource":"*","Condition":{"StringEqualsIfExists":{"aws:RequestTag/k":"v"}}}"#,
        );
        let none = Context::default();
        assert!(!eq.evaluate("a:b", "r", &none).is_allowed());
        assert!(ne.evaluate("a:b", "r", &none).is_allowed());
        assert!(if_exists.evaluate("a:b", "r", &none).is_allowed());
        let other = ctx(&[("aws:RequestTag/k", &["w"])]);
        assert!(!if_exists.evaluate("a:b", "r", &other).is_allowed());
        assert!(
            eq.evaluate("a:b", "r", &ctx(&[("AWS:requesttag/K", &["v"])]))
                .is_allowed()
        );
    }

    #[test]
    fn null_checks_presence() {
        let tagged = policy(
            r#"{"Effect":"Allow","Action":"*","Resource":"*","Condition":{"Null":{"aws:ResourceTag/t":"false"}}}"#,
        );
        assert!(
            tagged
                .evaluate("a:b", "r", &ctx(&[("aws:ResourceTag/t", &["shared"])]))
                .is_allowed()
        );
        assert!(
            !tagged
                .evaluate("a:b", "r", &Context::default())
                .is_allowed()
        );
    }

    #[test]
    fn set_operators_follow_aws_rules() {
        let all_not = policy(
            r#"{"Effect":"Allow","Action":"*","Resource":"*","Condition":{"ForAllValues:StringNotLike":{"aws:TagKeys":["kubernetes.io/cluster/*","KubernetesCluster"]}}}"#,
        );
        assert!(
            all_not
                .evaluate("a:b", "r", &ctx(&[("aws:TagKeys", &["a", "b"])]))
                .is_allowed()
        );
        assert!(
            !all_not
                .evaluate(
                    "a:b",
                    "r",
                    &ctx(&[("aws:TagKeys", &["a", "kubernetes.io/cluster/x"])])
                )
                .is_allowed()
        );
        assert!(
            !all_not
                .evaluate("a:b", "r", &ctx(&[("aws:TagKeys", &["KubernetesCluster"])]))
                .is_allowed()
        );
        // ForAllValues is true for an absent key: AWS's pitfall, kept.
        assert!(
            all_not
                .evaluate("a:b", "r", &Context::default())
                .is_allowed()
        );
        let any = policy(
            r#"{"Effect":"Allow","Action":"*","Resource":"*","Condition":{"ForAnyValue:StringEquals":{"aws:TagKeys":"x"}}}"#,
        );
        assert!(
            any.evaluate("a:b", "r", &ctx(&[("aws:TagKeys", &["y", "x"])]))
                .is_allowed()
        );
        assert!(!any.evaluate("a:b", "r", &Context::default()).is_allowed());
        // A single-valued operator on a multivalued key never matches.
        let single = policy(
            r#"{"Effect":"Allow","Action":"*","Resource":"*","Condition":{"StringLike":{"aws:TagKeys":"*"}}}"#,
        );
        assert!(
            !single
                .evaluate("a:b", "r", &ctx(&[("aws:TagKeys", &["y", "x"])]))
                .is_allowed()
        );
    }

    #[test]
    fn conditions_and_together_values_or_together() {
        let p = policy(
            r#"{"Effect":"Allow","Action":"*","Resource":"*","Condition":{
                "StringEquals":{"k1":["a","b"],"k2":"c"},"StringLike":{"k3":"d*"}}}"#,
        );
        assert!(
            p.evaluate(
                "x:y",
                "r",
                &ctx(&[("k1", &["b"]), ("k2", &["c"]), ("k3", &["dd"])])
            )
            .is_allowed()
        );
        assert!(
            !p.evaluate(
                "x:y",
                "r",
                &ctx(&[("k1", &["b"]), ("k2", &["c"]), ("k3", &["e"])])
            )
            .is_allowed()
        );
        assert!(
            !p.evaluate(
                "x:y",
                "r",
                &ctx(&[("k1", &["z"]), ("k2", &["c"]), ("k3", &["d"])])
            )
            .is_allowed()
        );
    }

    #[test]
    fn not_action_and_not_resource_invert() {
        let p = policy(
            r#"{"Effect":"Allow","NotAction":"iam:*","NotResource":"arn:aws:ec2:*:*:vpc/*"}"#,
        );
        assert!(
            p.evaluate(
                "ec2:CreateRoute",
                "arn:aws:ec2:r:1:route-table/rtb-1",
                &Context::default()
            )
            .is_allowed()
        );
        assert!(
            !p.evaluate("iam:CreateRole", "x", &Context::default())
                .is_allowed()
        );
        assert!(
            !p.evaluate(
                "ec2:CreateRoute",
                "arn:aws:ec2:r:1:vpc/vpc-1",
                &Context::default()
            )
            .is_allowed()
        );
    }

    #[test]
    fn unknown_elements_and_operators_are_errors() {
        let bad_op = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":"*","Condition":{"StringSortOfEquals":{"k":"v"}}}]}"#;
        assert!(
            Policy::parse(bad_op)
                .unwrap_err()
                .contains("StringSortOfEquals")
        );
        let principal = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":"*","Action":"*","Resource":"*"}]}"#;
        assert!(Policy::parse(principal).unwrap_err().contains("Principal"));
        let old = r#"{"Version":"2008-10-17","Statement":[]}"#;
        assert!(Policy::parse(old).is_err());
    }
}
