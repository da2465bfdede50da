//! Eventual consistency, as EC2 and ELB really behave: a resource the proxy
//! has just seen created stays invisible for a configurable window.
//!
//! In the window:
//! - a call that names it (`GroupId=sg-…`, `LoadBalancerArn=…`,
//!   `LoadBalancerNames.member.1=…`, a source group in a rule, …) gets the
//!   NotFound error the real service gives (`InvalidGroup.NotFound`,
//!   `LoadBalancerNotFound`, `TargetGroupNotFound`, `ListenerNotFound`);
//! - a describe that lists resources of its kind leaves it out, whether the
//!   list was filtered (`Filter.N`, tags) or not.
//!
//! After the window it behaves normally. The window follows the proxy's
//! bucket clock, so a test on [`super::ManualClock`] ends it by advancing the
//! clock, without sleeping.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::errors::AwsError;
use super::throttle::{SERVICE_EC2, SERVICE_ELB, SERVICE_ELBV2};

/// A kind of resource the window applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    SecurityGroup,
    ClassicLoadBalancer,
    LoadBalancer,
    TargetGroup,
    Listener,
}

/// Where a kind is created, listed and how it is reported missing.
struct KindSpec {
    kind: Kind,
    service: &'static str,
    create: &'static str,
    /// The element of the create answer holding the new id; `None` when the
    /// id is the request's `LoadBalancerName` (Classic ELB).
    created_id: Option<&'static str>,
    /// The describe that lists this kind: (action, list element, item
    /// element, id element of an item).
    list: (&'static str, &'static str, &'static str, &'static str),
}

const KINDS: &[KindSpec] = &[
    KindSpec {
        kind: Kind::SecurityGroup,
        service: SERVICE_EC2,
        create: "CreateSecurityGroup",
        created_id: Some("groupId"),
        list: (
            "DescribeSecurityGroups",
            "securityGroupInfo",
            "item",
            "groupId",
        ),
    },
    KindSpec {
        kind: Kind::ClassicLoadBalancer,
        service: SERVICE_ELB,
        create: "CreateLoadBalancer",
        created_id: None,
        list: (
            "DescribeLoadBalancers",
            "LoadBalancerDescriptions",
            "member",
            "LoadBalancerName",
        ),
    },
    KindSpec {
        kind: Kind::LoadBalancer,
        service: SERVICE_ELBV2,
        create: "CreateLoadBalancer",
        created_id: Some("LoadBalancerArn"),
        list: (
            "DescribeLoadBalancers",
            "LoadBalancers",
            "member",
            "LoadBalancerArn",
        ),
    },
    KindSpec {
        kind: Kind::TargetGroup,
        service: SERVICE_ELBV2,
        create: "CreateTargetGroup",
        created_id: Some("TargetGroupArn"),
        list: (
            "DescribeTargetGroups",
            "TargetGroups",
            "member",
            "TargetGroupArn",
        ),
    },
    KindSpec {
        kind: Kind::Listener,
        service: SERVICE_ELBV2,
        create: "CreateListener",
        created_id: Some("ListenerArn"),
        list: ("DescribeListeners", "Listeners", "member", "ListenerArn"),
    },
];

impl Kind {
    /// The error the real service answers a call naming a missing `id` with.
    fn not_found(self, id: &str) -> AwsError {
        match self {
            Kind::SecurityGroup => AwsError::new(
                400,
                "InvalidGroup.NotFound",
                format!("The security group '{id}' does not exist"),
            ),
            Kind::ClassicLoadBalancer => AwsError::new(
                400,
                "LoadBalancerNotFound",
                format!("There is no ACTIVE Load Balancer named '{id}'"),
            ),
            Kind::LoadBalancer => AwsError::new(
                400,
                "LoadBalancerNotFound",
                "One or more load balancers not found",
            ),
            Kind::TargetGroup => AwsError::new(
                400,
                "TargetGroupNotFound",
                "One or more target groups not found",
            ),
            Kind::Listener => {
                AwsError::new(400, "ListenerNotFound", "One or more listeners not found")
            }
        }
    }

    fn service(self) -> &'static str {
        KINDS
            .iter()
            .find(|spec| spec.kind == self)
            .map_or("", |spec| spec.service)
    }
}

#[derive(Debug)]
struct Hidden {
    kind: Kind,
    id: String,
    visible_at: Instant,
}

/// The resources still inside their window.
#[derive(Debug, Default)]
pub(crate) struct Consistency {
    delay: Mutex<Duration>,
    hidden: Mutex<Vec<Hidden>>,
    hits: Mutex<ConsistencyHits>,
}

/// How often the window changed an answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConsistencyHits {
    /// Calls naming a hidden resource, answered with its NotFound error.
    pub not_found: u64,
    /// List answers a hidden resource was left out of.
    pub left_out: u64,
}

impl Consistency {
    /// Sets the window for resources created from now on (zero: none).
    pub(crate) fn set_delay(&self, delay: Duration) {
        *self.delay.lock() = delay;
    }

    pub(crate) fn hits(&self) -> ConsistencyHits {
        *self.hits.lock()
    }

    fn active(&self, now: Instant) -> bool {
        let mut hidden = self.hidden.lock();
        hidden.retain(|h| h.visible_at > now);
        !hidden.is_empty()
    }

    /// Whether answers to `service`/`action` must be read whole: a create
    /// the window applies to, while a window is set, or a list while
    /// something is hidden.
    pub(crate) fn wants_answer(&self, service: &str, action: &str, now: Instant) -> bool {
        let creates = !self.delay.lock().is_zero()
            && KINDS
                .iter()
                .any(|s| s.service == service && s.create == action);
        creates || (self.active(now) && list_spec(service, action).is_some())
    }

    /// The NotFound error for a call that names a hidden resource of its
    /// service. Filters do not name: a filtered describe leaves it out instead.
    pub(crate) fn refuse(
        &self,
        service: &str,
        action: &str,
        params: &[(String, String)],
        now: Instant,
    ) -> Option<AwsError> {
        if !self.active(now)
            || KINDS
                .iter()
                .any(|s| s.service == service && s.create == action)
        {
            return None;
        }
        let hidden = self.hidden.lock();
        let refusal = params
            .iter()
            .filter(|(name, _)| !name.starts_with("Filter."))
            .find_map(|(_, value)| {
                hidden
                    .iter()
                    .find(|h| h.kind.service() == service && h.id == *value)
                    .map(|h| h.kind.not_found(&h.id))
            });
        if refusal.is_some() {
            self.hits.lock().not_found += 1;
        }
        refusal
    }

    /// Notes what a successful answer created, and returns the answer with
    /// hidden resources left out of a list.
    pub(crate) fn observe(
        &self,
        service: &str,
        action: &str,
        params: &[(String, String)],
        body: &str,
        now: Instant,
    ) -> Option<String> {
        if let Some(spec) = KINDS
            .iter()
            .find(|s| s.service == service && s.create == action)
        {
            let delay = *self.delay.lock();
            let id = match spec.created_id {
                Some(element) => element_text(body, element),
                None => params
                    .iter()
                    .find(|(name, _)| name == "LoadBalancerName")
                    .map(|(_, v)| v.clone()),
            };
            if let Some(id) = id.filter(|_| !delay.is_zero()) {
                self.hidden.lock().push(Hidden {
                    kind: spec.kind,
                    id,
                    visible_at: now + delay,
                });
            }
            return None;
        }
        let spec = list_spec(service, action)?;
        let (_, list, item, id_element) = spec.list;
        let hidden = self.hidden.lock();
        let ids: Vec<&str> = hidden
            .iter()
            .filter(|h| h.kind == spec.kind && h.visible_at > now)
            .map(|h| h.id.as_str())
            .collect();
        if ids.is_empty() {
            return None;
        }
        let rewritten = without_items(body, list, item, id_element, &ids);
        if rewritten.len() != body.len() {
            self.hits.lock().left_out += 1;
        }
        Some(rewritten)
    }
}

fn list_spec(service: &str, action: &str) -> Option<&'static KindSpec> {
    KINDS
        .iter()
        .find(|s| s.service == service && s.list.0 == action)
}

/// The trimmed text of the first `<element>…</element>` in `xml`.
fn element_text(xml: &str, element: &str) -> Option<String> {
    super::iam::first(xml, element).map(|text| text.trim().to_owned())
}

/// One tag of an XML text: its byte range and what it is.
struct Tag<'a> {
    start: usize,
    end: usize,
    name: &'a str,
    closing: bool,
    empty: bool,
}

/// The tags of `xml` from byte `from`, in order (no comments or CDATA in
/// the AWS answers this reads).
fn tags(xml: &str, from: usize) -> impl Iterator<Item = Tag<'_>> {
    let mut at = from;
    std::iter::from_fn(move || {
        let start = at + xml[at..].find('<')?;
        let end = start + xml[start..].find('>')? + 1;
        at = end;
        let inner = &xml[start + 1..end - 1];
        let closing = inner.starts_with('/');
        let empty = inner.ends_with('/') || inner.starts_with('?');
        let name = inner
            .trim_start_matches('/')
            .split(|c: char| c.is_whitespace() || c == '/')
            .next()
            .unwrap_or("");
        Some(Tag {
            start,
            end,
            name,
            closing,
            empty,
        })
    })
}

/// `xml` without the `<item>` children of `<list>` whose own `<id_element>`
/// is one of `ids` (nested items naming the id, such as a rule's source
/// group, are not items of the list and stay).
fn without_items(xml: &str, list: &str, item: &str, id_element: &str, ids: &[&str]) -> String {
    let mut cut: Vec<(usize, usize)> = Vec::new();
    let mut from = 0;
    while let Some(open) = tags(xml, from).find(|t| t.name == list && !t.closing && !t.empty) {
        let mut depth = 0usize;
        let mut item_start = None;
        let mut item_id: Option<String> = None;
        let mut list_end = xml.len();
        for tag in tags(xml, open.end) {
            match (tag.closing, tag.empty, depth) {
                (true, _, 0) => {
                    list_end = tag.end;
                    break;
                }
                (false, false, 0) if tag.name == item => {
                    item_start = Some(tag.start);
                    item_id = None;
                    depth = 1;
                }
                (false, false, 1) if tag.name == id_element => {
                    item_id = element_text(&xml[tag.start..], id_element);
                    depth += 1;
                }
                (false, false, _) => depth += 1,
                (true, _, 1) => {
                    depth = 0;
                    if let (Some(start), Some(id)) = (item_start.take(), item_id.take())
                        && ids.contains(&id.as_str())
                    {
                        cut.push((start, tag.end));
                    }
                }
                (true, _, _) => depth -= 1,
                (false, true, _) => {}
            }
        }
        from = list_end;
    }
    let mut out = String::with_capacity(xml.len());
    let mut at = 0;
    for (start, end) in cut {
        out.push_str(&xml[at..start]);
        at = end;
    }
    out.push_str(&xml[at..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const GROUPS: &str = "<DescribeSecurityGroupsResponse><securityGroupInfo>\
        <item><groupId>sg-1</groupId><ipPermissions><item><groups><item><groupId>sg-2</groupId></item></groups></item></ipPermissions></item>\
        <item><groupId>sg-2</groupId><groupName>b</groupName><tagSet/></item>\
        </securityGroupInfo></DescribeSecurityGroupsResponse>";

    #[test]
    fn lists_leave_out_only_the_hidden_items() {
        let out = without_items(GROUPS, "securityGroupInfo", "item", "groupId", &["sg-2"]);
        assert!(out.contains("<groupId>sg-1</groupId>"), "{out}");
        // The rule of sg-1 that names sg-2 is not an item of the list.
        assert!(
            out.contains("<item><groupId>sg-2</groupId></item>"),
            "{out}"
        );
        assert!(!out.contains("<groupName>b</groupName>"), "{out}");
        assert_eq!(
            without_items(GROUPS, "securityGroupInfo", "item", "groupId", &["sg-9"]),
            GROUPS
        );
    }

    #[test]
    fn a_created_group_is_missing_until_its_window_ends() {
        let c = Consistency::default();
        let t0 = Instant::now();
        c.set_delay(Duration::from_secs(5));
        assert!(c.wants_answer(SERVICE_EC2, "CreateSecurityGroup", t0));
        c.observe(
            SERVICE_EC2,
            "CreateSecurityGroup",
            &[],
            "<CreateSecurityGroupResponse><groupId>sg-2</groupId></CreateSecurityGroupResponse>",
            t0,
        );
        let named = [("GroupId".to_owned(), "sg-2".to_owned())];
        let err = c
            .refuse(SERVICE_EC2, "AuthorizeSecurityGroupIngress", &named, t0)
            .expect("named in the window");
        assert_eq!(err.code, "InvalidGroup.NotFound");
        assert_eq!(err.message, "The security group 'sg-2' does not exist");
        let filtered = [("Filter.1.Value.1".to_owned(), "sg-2".to_owned())];
        assert!(
            c.refuse(SERVICE_EC2, "DescribeSecurityGroups", &filtered, t0)
                .is_none()
        );
        let listed = c
            .observe(SERVICE_EC2, "DescribeSecurityGroups", &[], GROUPS, t0)
            .expect("rewritten");
        assert!(!listed.contains("<groupName>b</groupName>"));
        // Another service's call naming the same string is not refused.
        assert!(
            c.refuse(SERVICE_ELBV2, "DescribeTags", &named, t0)
                .is_none()
        );
        // A list the hidden group is not in is not counted as changed.
        let other = GROUPS.replace("sg-2", "sg-3");
        c.observe(SERVICE_EC2, "DescribeSecurityGroups", &[], &other, t0);
        assert_eq!(
            c.hits(),
            ConsistencyHits {
                not_found: 1,
                left_out: 1
            }
        );

        let later = t0 + Duration::from_secs(5);
        assert!(
            c.refuse(SERVICE_EC2, "AuthorizeSecurityGroupIngress", &named, later)
                .is_none()
        );
        assert!(
            c.observe(SERVICE_EC2, "DescribeSecurityGroups", &[], GROUPS, later)
                .is_none()
        );
    }

    #[test]
    fn a_classic_load_balancer_is_known_by_the_name_it_was_created_with() {
        let c = Consistency::default();
        let t0 = Instant::now();
        c.set_delay(Duration::from_secs(1));
        let name = [("LoadBalancerName".to_owned(), "a1b2".to_owned())];
        c.observe(
            SERVICE_ELB,
            "CreateLoadBalancer",
            &name,
            "<CreateLoadBalancerResponse/>",
            t0,
        );
        let err = c
            .refuse(SERVICE_ELB, "ConfigureHealthCheck", &name, t0)
            .expect("refused");
        assert_eq!(err.code, "LoadBalancerNotFound");
        assert_eq!(err.message, "There is no ACTIVE Load Balancer named 'a1b2'");
    }

    #[test]
    fn no_window_means_nothing_hidden() {
        let c = Consistency::default();
        let t0 = Instant::now();
        assert!(!c.wants_answer(SERVICE_EC2, "CreateSecurityGroup", t0));
        c.observe(
            SERVICE_EC2,
            "CreateSecurityGroup",
            &[],
            "<groupId>sg-2</groupId>",
            t0,
        );
        let named = [("GroupId".to_owned(), "sg-2".to_owned())];
        assert!(
            c.refuse(SERVICE_EC2, "DeleteSecurityGroup", &named, t0)
                .is_none()
        );
    }
}
