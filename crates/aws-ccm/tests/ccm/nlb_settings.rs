//! NLB settings past the Go CCM (issue 45): tags that follow
//! `additional-resource-tags` on a live NLB, its listeners and target
//! groups, from a fresh cluster and from the Go CCM's state. The real binary
//! against the API test server and moto, mutations counted at the fault
//! proxy.

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_elasticloadbalancingv2 as elbv2;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::{Patch, PatchParams};

use crate::nlb::{lb_name, nlb_service};
use crate::support::*;
use crate::swap::{go_made_nlb, nodes_and_services, wait_hostname};

const WAIT: Duration = Duration::from_secs(60);
const TAGS: &str = "service.beta.kubernetes.io/aws-load-balancer-additional-resource-tags";
const MARKER: &str = "kubernetes.io/cloud-controller/managed-tags";

type TagMap = BTreeMap<String, String>;

/// The tags of Service `svc`'s NLB, its listeners and its target groups,
/// as (`nlb` | `listener` | `tg`, tags).
async fn tags_by_kind(c: &elbv2::Client, svc: &Service) -> anyhow::Result<Vec<(String, TagMap)>> {
    let arns = arns_of(c, svc).await?;
    let described = c
        .describe_tags()
        .set_resource_arns(Some(arns.iter().map(|(_, a)| a.clone()).collect()))
        .send()
        .await?;
    let mut out = Vec::new();
    for (kind, arn) in arns {
        let d = described
            .tag_descriptions()
            .iter()
            .find(|d| d.resource_arn() == Some(arn.as_str()))
            .ok_or_else(|| anyhow::anyhow!("no tags for {arn}"))?;
        let tags = d
            .tags()
            .iter()
            .map(|t| {
                (
                    t.key().unwrap_or_default().to_string(),
                    t.value().unwrap_or_default().to_string(),
                )
            })
            .collect();
        out.push((kind, tags));
    }
    Ok(out)
}

/// The pairs of `tags` whose keys are in `keys` (what a check looks at).
fn only(tags: &TagMap, keys: &[&str]) -> TagMap {
    tags.iter()
        .filter(|(k, _)| keys.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn pairs(p: &[(&str, &str)]) -> TagMap {
    p.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Waits until the NLB, each listener and each target group of `svc`
/// carry exactly `want` among the keys `watched`, and the ownership tags.
async fn wait_tags(
    c: &elbv2::Client,
    svc: &Service,
    watched: &[&str],
    want: &TagMap,
    ccm: &Ccm,
) -> anyhow::Result<Vec<(String, TagMap)>> {
    let cluster = format!("kubernetes.io/cluster/{CLUSTER_ID}");
    let key = format!("default/{}", svc.metadata.name.as_deref().unwrap());
    eventually(&format!("tags {want:?} everywhere"), WAIT, || async {
        let all = tags_by_kind(c, svc).await.ok()?;
        let kinds: std::collections::BTreeSet<&str> = all.iter().map(|(k, _)| k.as_str()).collect();
        (kinds.len() == 3
            && all.iter().all(|(_, t)| {
                only(t, watched) == *want
                    && t.get(&cluster).map(String::as_str) == Some("owned")
                    && t.get("kubernetes.io/service-name") == Some(&key)
            }))
        .then_some(all)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))
}

async fn set_tags(api: &Api<Service>, name: &str, value: Option<&str>) -> anyhow::Result<()> {
    annotate(api, name, TAGS, value).await
}

/// Sets annotation `key` of Service `name` to `value` (`None`: removes it).
async fn annotate(
    api: &Api<Service>,
    name: &str,
    key: &str,
    value: Option<&str>,
) -> anyhow::Result<()> {
    let patch = serde_json::json!({"metadata": {"annotations": {key: value}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Tag `key` (a record of this CCM's) of `svc`'s first resource of `kind`
/// (`nlb`, `listener`, `tg`).
async fn record_of(
    c: &elbv2::Client,
    svc: &Service,
    kind: &str,
    key: &str,
) -> anyhow::Result<Option<String>> {
    let tags = tags_by_kind(c, svc).await?;
    let first = tags.iter().find(|(k, _)| k == kind);
    Ok(first.and_then(|(_, t)| t.get(key).cloned()))
}

/// Waits until `read` (a setting as AWS holds it, and this CCM's record of
/// it) gives `want`.
async fn wait_setting<T, F, Fut>(what: &str, want: T, read: F) -> anyhow::Result<()>
where
    T: PartialEq + std::fmt::Debug,
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    eventually(&format!("{what} {want:?}"), WAIT, || async {
        (read().await.ok()? == want).then_some(())
    })
    .await
}

/// The note of the first `NLBSettingRefused` event of Service `web` that
/// contains `needle`.
async fn refused_note(env: &Env, needle: &str) -> anyhow::Result<String> {
    eventually("an NLBSettingRefused event", WAIT, || async {
        let events = crate::routes::events_for(env, "web", "NLBSettingRefused").await;
        events
            .into_iter()
            .find_map(|e| e.note.filter(|n| n.contains(needle)))
    })
    .await
}

/// A cluster of one node and one NLB Service `web` with `annotations` (not
/// synced yet), and an ELBv2 client.
async fn one_nlb(
    annotations: serde_json::Value,
) -> anyhow::Result<(Env, Seeded, elbv2::Client, Service)> {
    one_nlb_in(Env::start().await?, annotations).await
}

/// cloud.conf with `NLBListenerSettings` set to `on`.
fn listener_settings_conf(on: bool) -> String {
    format!(
        "[Global]\nRegion = {REGION}\nKubernetesClusterID = {CLUSTER_ID}\nNLBListenerSettings = {on}\n"
    )
}

/// An environment whose cloud.conf has `NLBListenerSettings = true`.
async fn listener_settings_env() -> anyhow::Result<Env> {
    Env::start_with_conf(&listener_settings_conf(true)).await
}

/// [`one_nlb`] in `env`.
async fn one_nlb_in(
    env: Env,
    annotations: serde_json::Value,
) -> anyhow::Result<(Env, Seeded, elbv2::Client, Service)> {
    let seeded = seed_cluster(&env, 1).await?;
    let c = elbv2::Client::new(&seeded.conf);
    let svc = nodes_and_services(&env, &seeded, &[nlb_service("web", annotations)])
        .await?
        .remove(0);
    Ok((env, seeded, c, svc))
}

/// Someone else's tag on a resource: never the CCM's to remove.
async fn tag_by_hand(c: &elbv2::Client, arn: &str, key: &str, value: &str) -> anyhow::Result<()> {
    c.add_tags()
        .resource_arns(arn)
        .tags(elbv2::types::Tag::builder().key(key).value(value).build())
        .send()
        .await?;
    Ok(())
}

async fn nlb_arn(c: &elbv2::Client, svc: &Service) -> anyhow::Result<String> {
    let lbs = c
        .describe_load_balancers()
        .names(lb_name(svc))
        .send()
        .await?;
    Ok(lbs.load_balancers()[0]
        .load_balancer_arn()
        .unwrap()
        .to_string())
}

const WATCHED: &[&str] = &["team", "env", "cost", "owner", MARKER];

/// A fresh cluster: the NLB, its listener and target group are created
/// with the annotation's tags and the record of their keys; a changed
/// annotation adds and removes exactly those keys on all three, leaves a
/// tag someone else wrote, and a restart makes no call.
/// A fresh CCM process after `ccm` (stopped) finds nothing to write.
async fn a_restart_writes_nothing(env: &Env, ccm: Ccm) -> anyhow::Result<()> {
    drop(ccm);
    let (proxy, ccm) = env.start_counted_ccm(&["--controllers=service"]).await?;
    ccm.wait_synced(1, WAIT).await?;
    assert_eq!(mutations(&proxy), BTreeMap::new(), "logs:\n{}", ccm.logs());
    Ok(())
}

#[tokio::test]
async fn tags_follow_the_annotation_on_a_live_nlb_its_listeners_and_target_groups()
-> anyhow::Result<()> {
    let (env, _seeded, c, svc) = one_nlb(serde_json::json!({ TAGS: "team=a,env=prod" })).await?;
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    wait_hostname(&env, &ccm, "web").await?;
    wait_tags(
        &c,
        &svc,
        WATCHED,
        &pairs(&[("team", "a"), ("env", "prod"), (MARKER, "env team")]),
        &ccm,
    )
    .await?;
    tag_by_hand(&c, &nlb_arn(&c, &svc).await?, "owner", "ops").await?;
    let api: Api<Service> = Api::namespaced(env.api.client().await?, "default");

    // Changed, added and removed keys.
    set_tags(&api, "web", Some("team=b,cost=42")).await?;
    let all = wait_tags(
        &c,
        &svc,
        &["team", "env", "cost", MARKER],
        &pairs(&[("team", "b"), ("cost", "42"), (MARKER, "cost team")]),
        &ccm,
    )
    .await?;
    let owner: Vec<_> = all
        .iter()
        .map(|(k, t)| (k.as_str(), t.get("owner")))
        .collect();
    assert!(
        owner.contains(&("nlb", Some(&"ops".to_string()))),
        "{owner:?}"
    );

    // The annotation removed: its keys and the record go, the rest stays.
    set_tags(&api, "web", None).await?;
    let all = wait_tags(
        &c,
        &svc,
        &["team", "env", "cost", MARKER],
        &TagMap::new(),
        &ccm,
    )
    .await?;
    let nlb_tags = &all.iter().find(|(k, _)| k == "nlb").unwrap().1;
    assert_eq!(nlb_tags.get("owner").map(String::as_str), Some("ops"));

    // A fresh process finds nothing to write.
    a_restart_writes_nothing(&env, ccm).await?;
    env.finish().await
}

/// From the Go CCM's state: an NLB it made with the annotation's tags on
/// the NLB, listener and target group, and no record. The swap makes no
/// call; a changed annotation is then followed on all three, with the
/// record written, and removing it removes what this CCM recorded.
#[tokio::test]
async fn after_a_swap_tags_follow_the_annotation_only_once_it_changes() -> anyhow::Result<()> {
    let (env, seeded, c, svc) = one_nlb(serde_json::json!({ TAGS: "team=a" })).await?;
    go_made_nlb(&seeded, &svc, &[]).await?;
    // The Go CCM's creates carry the annotation's tags (buildTags), on the
    // listener too (createListenerV2), with the ownership tags.
    for (kind, arn) in arns_of(&c, &svc).await? {
        tag_by_hand(&c, &arn, "team", "a").await?;
        if kind == "listener" {
            let cluster = format!("kubernetes.io/cluster/{CLUSTER_ID}");
            tag_by_hand(&c, &arn, &cluster, "owned").await?;
            tag_by_hand(&c, &arn, "kubernetes.io/service-name", "default/web").await?;
        }
    }

    let (proxy, ccm) = env.start_counted_ccm(&["--controllers=service"]).await?;
    wait_hostname(&env, &ccm, "web").await?;
    ccm.wait_synced(1, WAIT).await?;
    assert_eq!(mutations(&proxy), BTreeMap::new(), "logs:\n{}", ccm.logs());
    for (kind, t) in tags_by_kind(&c, &svc).await? {
        assert_eq!(only(&t, WATCHED), pairs(&[("team", "a")]), "{kind}");
    }

    let api: Api<Service> = Api::namespaced(env.api.client().await?, "default");
    set_tags(&api, "web", Some("team=b,env=prod")).await?;
    wait_tags(
        &c,
        &svc,
        WATCHED,
        &pairs(&[("team", "b"), ("env", "prod"), (MARKER, "env team")]),
        &ccm,
    )
    .await?;
    let removed = proxy
        .calls()
        .iter()
        .find(|(_, a, _)| *a == "RemoveTags")
        .map(|(_, _, c)| c.received)
        .unwrap_or(0);
    assert_eq!(removed, 0, "nothing to remove yet");
    set_tags(&api, "web", None).await?;
    wait_tags(&c, &svc, WATCHED, &TagMap::new(), &ccm).await?;
    env.finish().await
}

/// The ARNs of `svc`'s NLB, listeners and target groups.
async fn arns_of(c: &elbv2::Client, svc: &Service) -> anyhow::Result<Vec<(String, String)>> {
    let lb = nlb_arn(c, svc).await?;
    let mut out = vec![("nlb".to_string(), lb.clone())];
    let listeners = c.describe_listeners().load_balancer_arn(&lb).send().await?;
    for l in listeners.listeners() {
        out.push(("listener".into(), l.listener_arn().unwrap().to_string()));
    }
    let tgs = c
        .describe_target_groups()
        .load_balancer_arn(&lb)
        .send()
        .await?;
    for g in tgs.target_groups() {
        out.push(("tg".into(), g.target_group_arn().unwrap().to_string()));
    }
    Ok(out)
}

const TGA: &str = "service.beta.kubernetes.io/aws-load-balancer-target-group-attributes";
const TG_RECORD: &str = "aws-ccm/target-group-attributes";

/// The attributes `keys` of `svc`'s (one) target group, and its record tag.
async fn group_attributes(
    c: &elbv2::Client,
    svc: &Service,
    keys: &[&str],
) -> anyhow::Result<(TagMap, Option<String>)> {
    let arns = arns_of(c, svc).await?;
    let (_, tg) = arns
        .iter()
        .find(|(k, _)| k == "tg")
        .ok_or_else(|| anyhow::anyhow!("no target group"))?;
    let attrs = c
        .describe_target_group_attributes()
        .target_group_arn(tg)
        .send()
        .await?;
    let got = attrs
        .attributes()
        .iter()
        .filter(|a| a.key().is_some_and(|k| keys.contains(&k)))
        .map(|a| {
            (
                a.key().unwrap().to_string(),
                a.value().unwrap_or_default().to_string(),
            )
        })
        .collect();
    Ok((got, record_of(c, svc, "tg", TG_RECORD).await?))
}

/// Every target group attribute AWS documents is applied through the
/// fault proxy, which refuses what AWS refuses (moto takes anything); a
/// changed value is applied, a dropped key returns to AWS's default and
/// leaves the record, and a restart makes no call.
#[tokio::test]
async fn target_group_attributes_are_applied_changed_and_dropped_back_to_the_default()
-> anyhow::Result<()> {
    const DEREG: &str = "deregistration_delay.timeout_seconds";
    const STICKY: &str = "stickiness.enabled";
    let (env, seeded, c, svc) =
        one_nlb(serde_json::json!({ TGA: format!("{DEREG}=30,{STICKY}=true") })).await?;
    let (proxy, ccm) = env.start_counted_ccm(&["--controllers=service"]).await?;
    wait_hostname(&env, &ccm, "web").await?;
    let expect = |dereg: &str, sticky: &str, record: Option<&str>| {
        let want = (
            pairs(&[(DEREG, dereg), (STICKY, sticky)]),
            record.map(String::from),
        );
        wait_setting("attributes", want, || {
            group_attributes(&c, &svc, &[DEREG, STICKY])
        })
    };
    let logs = |e: anyhow::Error| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs());
    expect(
        "30",
        "true",
        Some("deregistration_delay.timeout_seconds stickiness.enabled"),
    )
    .await
    .map_err(|e| logs(anyhow::anyhow!("{e}")))?;

    let api: Api<Service> = Api::namespaced(env.api.client().await?, "default");
    let patch = |v: Option<String>| serde_json::json!({"metadata": {"annotations": {TGA: v}}});
    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(&patch(Some(format!("{STICKY}=false")))),
    )
    .await?;
    expect("300", "false", Some(STICKY))
        .await
        .map_err(|e| logs(anyhow::anyhow!("{e}")))?;
    api.patch("web", &PatchParams::default(), &Patch::Merge(&patch(None)))
        .await?;
    expect("300", "false", None)
        .await
        .map_err(|e| logs(anyhow::anyhow!("{e}")))?;

    // The stand-in refuses what AWS refuses on an NLB's target group, and
    // refused nothing the CCM sent.
    let via_proxy = elbv2::Client::from_conf(
        elbv2::config::Builder::from(&seeded.conf)
            .endpoint_url(proxy.endpoint())
            .build(),
    );
    let tg = arns_of(&c, &svc)
        .await?
        .into_iter()
        .find(|(k, _)| k == "tg")
        .unwrap()
        .1;
    let refused = via_proxy
        .modify_target_group_attributes()
        .target_group_arn(&tg)
        .attributes(
            elbv2::types::TargetGroupAttribute::builder()
                .key("slow_start.duration_seconds")
                .value("30")
                .build(),
        )
        .send()
        .await
        .expect_err("an ALB attribute on an NLB's target group is refused");
    assert_eq!(
        refused.as_service_error().and_then(|e| e.meta().code()),
        Some("ValidationError")
    );
    let faulted: u64 = proxy
        .calls()
        .iter()
        .filter(|(_, a, _)| *a == "ModifyTargetGroupAttributes")
        .map(|(_, _, c)| c.faulted)
        .sum();
    assert_eq!(faulted, 1, "only the test's own call was refused");

    a_restart_writes_nothing(&env, ccm).await?;
    env.finish().await
}

const HC_TIMEOUT: &str = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-timeout";
const HC_RECORD: &str = "aws-ccm/health-check-timeout";

/// `svc`'s (one) target group's health-check timeout and its record tag.
async fn health_timeout(
    c: &elbv2::Client,
    svc: &Service,
) -> anyhow::Result<(Option<i32>, Option<String>)> {
    let lb = nlb_arn(c, svc).await?;
    let tgs = c
        .describe_target_groups()
        .load_balancer_arn(&lb)
        .send()
        .await?;
    let timeout = tgs
        .target_groups()
        .first()
        .and_then(|g| g.health_check_timeout_seconds());
    Ok((timeout, record_of(c, svc, "tg", HC_RECORD).await?))
}

/// With cloud.conf `NLBListenerSettings = true` the health-check timeout
/// (which the Go CCM parses for an NLB but never sends) is applied at
/// creation, changed in place, and returned to AWS's 10 s with its record
/// gone when the annotation is removed.
#[tokio::test]
async fn health_check_timeout_is_applied_changed_and_removed_with_the_key() -> anyhow::Result<()> {
    let (env, _seeded, c, svc) = one_nlb_in(
        listener_settings_env().await?,
        serde_json::json!({ HC_TIMEOUT: "20" }),
    )
    .await?;
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    wait_hostname(&env, &ccm, "web").await?;
    let expect = |timeout: i32, record: Option<&str>| {
        let want = (Some(timeout), record.map(String::from));
        wait_setting("health timeout", want, || health_timeout(&c, &svc))
    };
    let logs = |e: anyhow::Error| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs());
    expect(20, Some("20")).await.map_err(logs)?;
    let api: Api<Service> = Api::namespaced(env.api.client().await?, "default");
    let patch = |v: Option<&str>| serde_json::json!({"metadata": {"annotations": {HC_TIMEOUT: v}}});
    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(&patch(Some("15"))),
    )
    .await?;
    expect(15, Some("15")).await.map_err(logs)?;
    api.patch("web", &PatchParams::default(), &Patch::Merge(&patch(None)))
        .await?;
    expect(10, None).await.map_err(logs)?;
    drop(ccm);
    env.finish().await
}

const HC_INTERVAL: &str = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval";

/// With the key, a timeout above the interval (which AWS refuses) is not
/// sent: the Service gets a Warning naming the value and the fix, and the
/// rest of the NLB is made and upkept. The fault proxy holds a
/// ModifyTargetGroup timeout to AWS's rule (moto checks none of it), and
/// refused nothing the CCM sent.
#[tokio::test]
async fn health_check_timeout_above_the_interval_is_warned_and_the_rest_synced()
-> anyhow::Result<()> {
    let (env, seeded, c, svc) = one_nlb_in(
        listener_settings_env().await?,
        serde_json::json!({ HC_INTERVAL: "10", HC_TIMEOUT: "20" }),
    )
    .await?;
    let (proxy, ccm) = env.start_counted_ccm(&["--controllers=service"]).await?;
    wait_hostname(&env, &ccm, "web").await?;
    let logs = |e: anyhow::Error| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs());
    let note = refused_note(&env, HC_TIMEOUT).await.map_err(logs)?;
    assert!(
        note.contains(&format!("{HC_TIMEOUT}=\"20\"")) && note.contains("at most the interval"),
        "{note}"
    );
    let (timeout, record) = health_timeout(&c, &svc).await?;
    assert_ne!(timeout, Some(20), "the refused timeout was not sent");
    assert_eq!(record, None);
    // The rest of the NLB is upkept: its target group holds the node.
    let tg = arns_of(&c, &svc)
        .await?
        .into_iter()
        .find(|(k, _)| k == "tg")
        .unwrap()
        .1;
    let targets = eventually("the node registered", WAIT, || async {
        let h = c
            .describe_target_health()
            .target_group_arn(&tg)
            .send()
            .await
            .ok()?;
        (!h.target_health_descriptions().is_empty()).then_some(h.target_health_descriptions().len())
    })
    .await
    .map_err(logs)?;
    assert_eq!(targets, 1);
    assert_eq!(
        proxy
            .calls()
            .get("elasticloadbalancingv2", "ModifyTargetGroup")
            .faulted,
        0,
        "the CCM sent nothing the stand-in refuses"
    );

    let via_proxy = elbv2::Client::from_conf(
        elbv2::config::Builder::from(&seeded.conf)
            .endpoint_url(proxy.endpoint())
            .build(),
    );
    for (timeout, why) in [(121, "between '2' and '120'"), (20, "interval '10'")] {
        let refused = via_proxy
            .modify_target_group()
            .target_group_arn(&tg)
            .health_check_timeout_seconds(timeout)
            .send()
            .await
            .expect_err("a timeout out of ELBv2's rule is refused");
        let e = refused.as_service_error().map(|e| e.meta().clone());
        assert_eq!(e.as_ref().and_then(|m| m.code()), Some("ValidationError"));
        let message = e.as_ref().and_then(|m| m.message()).unwrap_or_default();
        assert!(message.contains(why), "{timeout}: {message}");
    }
    assert_eq!(
        proxy
            .calls()
            .get("elasticloadbalancingv2", "ModifyTargetGroup")
            .faulted,
        2,
        "only the test's own calls were refused"
    );
    let (timeout, _) = health_timeout(&c, &svc).await?;
    assert_ne!(timeout, Some(121), "a refused call changed nothing");
    drop(ccm);
    env.finish().await
}

const ALPN: &str = "service.beta.kubernetes.io/aws-load-balancer-alpn-policy";
const SSL_CERT: &str = "service.beta.kubernetes.io/aws-load-balancer-ssl-cert";
const ALPN_RECORD: &str = "aws-ccm/alpn-policy";

/// An ELBv2 client through `proxy`, which shows the ALPN policies moto
/// drops (see ccm-testkit's `aws_proxy::alpn`).
fn via(seeded: &Seeded, proxy: &ccm_testkit::aws_proxy::FaultProxy) -> elbv2::Client {
    elbv2::Client::from_conf(
        elbv2::config::Builder::from(&seeded.conf)
            .endpoint_url(proxy.endpoint())
            .build(),
    )
}

/// The ALPN policy of `svc`'s (one) listener, read through the proxy, and
/// the NLB's record of it.
async fn alpn_of(
    c: &elbv2::Client,
    svc: &Service,
) -> anyhow::Result<(Option<String>, Option<String>)> {
    let lb = nlb_arn(c, svc).await?;
    let listeners = c.describe_listeners().load_balancer_arn(&lb).send().await?;
    let policy = listeners
        .listeners()
        .first()
        .and_then(|l| l.alpn_policy().first().cloned());
    Ok((policy, record_of(c, svc, "nlb", ALPN_RECORD).await?))
}

async fn set_alpn(api: &Api<Service>, value: Option<&str>) -> anyhow::Result<()> {
    annotate(api, "web", ALPN, value).await
}

/// With cloud.conf `NLBListenerSettings = true` the ALPN policy (which the
/// Go CCM does not read) is set on the TLS listener at creation, changed
/// in place, left as it is with a Warning for a name AWS does not take,
/// and returned to AWS's `None` with its record gone when the annotation
/// is removed; a restart then makes no call. The fault proxy refuses what
/// ELBv2 refuses (moto takes any policy on any listener), and refused
/// nothing the CCM sent.
#[tokio::test]
async fn alpn_policy_is_applied_changed_and_removed_with_the_key() -> anyhow::Result<()> {
    let env = listener_settings_env().await?;
    let cert = crate::nlb::acm_certificate(&env.moto.endpoint()).await?;
    let (env, seeded, _, svc) = one_nlb_in(
        env,
        serde_json::json!({ SSL_CERT: cert, ALPN: "HTTP2Preferred" }),
    )
    .await?;
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    wait_hostname(&env, &ccm, "web").await?;
    let c = via(&seeded, &env.proxy);
    let expect = |policy: &str, record: Option<&str>| {
        let want = (Some(policy.to_string()), record.map(String::from));
        wait_setting("ALPN", want, || alpn_of(&c, &svc))
    };
    let logs = |e: anyhow::Error| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs());
    expect("HTTP2Preferred", Some("HTTP2Preferred"))
        .await
        .map_err(logs)?;
    let api: Api<Service> = Api::namespaced(env.api.client().await?, "default");
    set_alpn(&api, Some("HTTP1Only")).await?;
    expect("HTTP1Only", Some("HTTP1Only")).await.map_err(logs)?;

    // A name AWS does not take: a Warning, the policy left as it is.
    set_alpn(&api, Some("h2")).await?;
    let note = refused_note(&env, "h2").await.map_err(logs)?;
    assert!(note.starts_with(&format!("{ALPN}=\"h2\"")), "{note}");
    assert!(
        note.contains("HTTP2Preferred"),
        "the fix names AWS's policies: {note}"
    );
    assert_eq!(
        alpn_of(&c, &svc).await?,
        (Some("HTTP1Only".into()), Some("HTTP1Only".into()))
    );

    // Removed: back to AWS's None, the record gone.
    set_alpn(&api, None).await?;
    expect("None", None).await.map_err(logs)?;
    let sent = |action: &str| env.proxy.calls().get("elasticloadbalancingv2", action);
    assert_eq!(
        sent("ModifyListener").faulted,
        0,
        "the CCM sent nothing the stand-in refuses"
    );
    assert_eq!(sent("CreateListener").faulted, 0);

    // The stand-in refuses what ELBv2 refuses.
    let listener = c
        .describe_listeners()
        .load_balancer_arn(nlb_arn(&c, &svc).await?)
        .send()
        .await?
        .listeners()[0]
        .clone();
    let unknown = c
        .modify_listener()
        .listener_arn(listener.listener_arn().unwrap())
        .alpn_policy("h2")
        .send()
        .await
        .expect_err("a name AWS does not take is refused");
    assert_eq!(
        unknown.as_service_error().and_then(|e| e.meta().code()),
        Some("ALPNPolicyNotFound")
    );
    let tg = listener.default_actions()[0].target_group_arn().unwrap();
    let on_tcp = c
        .create_listener()
        .load_balancer_arn(listener.load_balancer_arn().unwrap())
        .port(81)
        .protocol(elbv2::types::ProtocolEnum::Tcp)
        .alpn_policy("HTTP2Preferred")
        .default_actions(
            elbv2::types::Action::builder()
                .r#type(elbv2::types::ActionTypeEnum::Forward)
                .target_group_arn(tg)
                .build(),
        )
        .send()
        .await
        .expect_err("a policy on a TCP listener is refused");
    assert_eq!(
        on_tcp.as_service_error().and_then(|e| e.meta().code()),
        Some("ValidationError")
    );
    assert_eq!(
        sent("ModifyListener").faulted,
        1,
        "only the test's own calls were refused"
    );
    assert_eq!(sent("CreateListener").faulted, 1);
    assert_eq!(alpn_of(&c, &svc).await?.0.as_deref(), Some("None"));

    a_restart_writes_nothing(&env, ccm).await?;
    env.finish().await
}

/// From the Go CCM's state: an NLB it made with a TLS listener for a
/// Service that carries the ALPN annotation (which the Go CCM does not
/// read). Without the key the swap makes no call, and the listener keeps
/// AWS's None; once the operator sets `NLBListenerSettings = true`,
/// `aws-ccm plan` shows the ModifyListener first and the CCM then applies
/// it with its record.
#[tokio::test]
async fn after_a_swap_the_alpn_policy_changes_nothing_until_the_key_is_set() -> anyhow::Result<()> {
    let env = Env::start_with_conf(&listener_settings_conf(false)).await?;
    let cert = crate::nlb::acm_certificate(&env.moto.endpoint()).await?;
    let (env, seeded, c, svc) = one_nlb_in(
        env,
        serde_json::json!({ SSL_CERT: cert, ALPN: "HTTP2Preferred" }),
    )
    .await?;
    go_made_nlb(&seeded, &svc, &[]).await?;
    // The Go CCM's TLS listener (createListenerV2 with the certificate, the
    // ownership tags and no ALPN policy), in place of the helper's TCP one.
    let lb = nlb_arn(&c, &svc).await?;
    let tcp = c
        .describe_listeners()
        .load_balancer_arn(&lb)
        .send()
        .await?
        .listeners()[0]
        .clone();
    c.delete_listener()
        .listener_arn(tcp.listener_arn().unwrap())
        .send()
        .await?;
    c.create_listener()
        .load_balancer_arn(&lb)
        .port(80)
        .protocol(elbv2::types::ProtocolEnum::Tls)
        .certificates(
            elbv2::types::Certificate::builder()
                .certificate_arn(&cert)
                .build(),
        )
        .set_default_actions(Some(tcp.default_actions().to_vec()))
        .tags(
            elbv2::types::Tag::builder()
                .key(format!("kubernetes.io/cluster/{CLUSTER_ID}"))
                .value("owned")
                .build(),
        )
        .tags(
            elbv2::types::Tag::builder()
                .key("kubernetes.io/service-name")
                .value("default/web")
                .build(),
        )
        .send()
        .await?;

    let (proxy, ccm) = env.start_counted_ccm(&["--controllers=service"]).await?;
    wait_hostname(&env, &ccm, "web").await?;
    ccm.wait_synced(1, WAIT).await?;
    assert_eq!(mutations(&proxy), BTreeMap::new(), "logs:\n{}", ccm.logs());
    let c = via(&seeded, &proxy);
    assert_eq!(alpn_of(&c, &svc).await?, (None, None));
    drop(ccm);

    // The operator opts in: the plan shows the change before it is made.
    std::fs::write(&env.cloud_conf, listener_settings_conf(true))?;
    let (ok, text, err) =
        crate::ops_orphans::run_tool(&env, "plan", &["--controllers=service"], "").await?;
    assert!(ok, "aws-ccm plan failed: {err}");
    assert!(
        text.contains("~ modify listener TLS 80 (ALPN policy HTTP2Preferred)")
            && text.contains("~ tag the NLB with [\"aws-ccm/alpn-policy\"]"),
        "{text}"
    );
    // (The environment's proxy has carried the plan's calls alone.)
    assert_eq!(
        mutations(&env.proxy),
        BTreeMap::new(),
        "the plan wrote nothing"
    );
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    let c = via(&seeded, &env.proxy);
    eventually("the policy applied and recorded", WAIT, || async {
        let got = alpn_of(&c, &svc).await.ok()?;
        (got == (Some("HTTP2Preferred".into()), Some("HTTP2Preferred".into()))).then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    drop(ccm);
    env.finish().await
}

const LISTENER_80: &str = "service.beta.kubernetes.io/aws-load-balancer-listener-attributes.TCP-80";
const ATTRIBUTES_RECORD: &str = "aws-ccm/listener-attributes";

/// The TCP idle timeout of `svc`'s (one) listener as moto holds it, and the
/// NLB's record of the attributes this CCM applied.
async fn idle_timeout_of(
    c: &elbv2::Client,
    svc: &Service,
) -> anyhow::Result<(Option<String>, Option<String>)> {
    let lb = nlb_arn(c, svc).await?;
    let listeners = c.describe_listeners().load_balancer_arn(&lb).send().await?;
    let arn = listeners.listeners()[0].listener_arn().unwrap_or_default();
    let attributes = c
        .describe_listener_attributes()
        .listener_arn(arn)
        .send()
        .await?;
    let timeout = attributes
        .attributes()
        .iter()
        .find(|a| a.key() == Some("tcp.idle_timeout.seconds"))
        .and_then(|a| a.value().map(String::from));
    Ok((timeout, record_of(c, svc, "nlb", ATTRIBUTES_RECORD).await?))
}

async fn set_listener_attributes(api: &Api<Service>, value: Option<&str>) -> anyhow::Result<()> {
    annotate(api, "web", LISTENER_80, value).await
}

/// With cloud.conf `NLBListenerSettings = true` the TCP idle timeout of a
/// listener (which the Go CCM does not read) is set after the listener's
/// creation, changed in place, left as it is with a Warning for a value
/// AWS does not take, and returned to AWS's 350 s with its record gone
/// when the annotation is removed; a restart then makes no call. The fault
/// proxy refuses what ELBv2 refuses (moto takes any key and value), and
/// refused nothing the CCM sent.
#[tokio::test]
async fn listener_attributes_are_applied_changed_and_removed_with_the_key() -> anyhow::Result<()> {
    let (env, seeded, _, svc) = one_nlb_in(
        listener_settings_env().await?,
        serde_json::json!({ LISTENER_80: "tcp.idle_timeout.seconds=400" }),
    )
    .await?;
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    wait_hostname(&env, &ccm, "web").await?;
    let c = via(&seeded, &env.proxy);
    let expect = |timeout: &str, record: Option<&str>| {
        let want = (Some(timeout.to_string()), record.map(String::from));
        wait_setting("idle timeout", want, || idle_timeout_of(&c, &svc))
    };
    let logs = |e: anyhow::Error| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs());
    expect("400", Some("80:tcp.idle_timeout.seconds=400"))
        .await
        .map_err(logs)?;
    let api: Api<Service> = Api::namespaced(env.api.client().await?, "default");
    set_listener_attributes(&api, Some("tcp.idle_timeout.seconds=600")).await?;
    expect("600", Some("80:tcp.idle_timeout.seconds=600"))
        .await
        .map_err(logs)?;

    // A timeout AWS does not take: a Warning, the listener left as it is.
    set_listener_attributes(&api, Some("tcp.idle_timeout.seconds=30")).await?;
    let note = refused_note(&env, "idle_timeout.seconds=30")
        .await
        .map_err(logs)?;
    assert!(note.starts_with(&format!("{LISTENER_80}=")), "{note}");
    assert!(
        note.contains("from 60 to 6000"),
        "the fix names AWS's range: {note}"
    );
    assert_eq!(
        idle_timeout_of(&c, &svc).await?,
        (
            Some("600".into()),
            Some("80:tcp.idle_timeout.seconds=600".into())
        )
    );

    // Removed: back to AWS's 350 s, the record gone.
    set_listener_attributes(&api, None).await?;
    expect("350", None).await.map_err(logs)?;
    let sent = |action: &str| env.proxy.calls().get("elasticloadbalancingv2", action);
    assert_eq!(
        sent("ModifyListenerAttributes").faulted,
        0,
        "the CCM sent nothing the stand-in refuses"
    );
    assert!(
        sent("ModifyListenerAttributes").received >= 3,
        "set, changed, reset"
    );

    // The stand-in refuses what ELBv2 refuses.
    let listener = c
        .describe_listeners()
        .load_balancer_arn(nlb_arn(&c, &svc).await?)
        .send()
        .await?
        .listeners()[0]
        .clone();
    for value in ["30", "forever"] {
        let refused = c
            .modify_listener_attributes()
            .listener_arn(listener.listener_arn().unwrap())
            .attributes(
                elbv2::types::ListenerAttribute::builder()
                    .key("tcp.idle_timeout.seconds")
                    .value(value)
                    .build(),
            )
            .send()
            .await
            .expect_err("a timeout AWS does not take is refused");
        assert_eq!(
            refused.as_service_error().and_then(|e| e.meta().code()),
            Some("InvalidConfigurationRequest")
        );
    }
    assert_eq!(
        sent("ModifyListenerAttributes").faulted,
        2,
        "only the test's own calls were refused"
    );
    assert_eq!(idle_timeout_of(&c, &svc).await?.0.as_deref(), Some("350"));

    a_restart_writes_nothing(&env, ccm).await?;
    env.finish().await
}

/// From the Go CCM's state: an NLB it made for a Service that carries the
/// listener-attributes annotation (which the Go CCM does not read). Without
/// the key the swap makes no call and the listener keeps AWS's 350 s; once
/// the operator sets `NLBListenerSettings = true`, `aws-ccm plan` shows the
/// ModifyListenerAttributes and the record first, and the CCM then applies
/// them.
#[tokio::test]
async fn after_a_swap_listener_attributes_change_nothing_until_the_key_is_set() -> anyhow::Result<()>
{
    let (env, seeded, c, svc) = one_nlb_in(
        Env::start_with_conf(&listener_settings_conf(false)).await?,
        serde_json::json!({ LISTENER_80: "tcp.idle_timeout.seconds=400" }),
    )
    .await?;
    go_made_nlb(&seeded, &svc, &[]).await?;
    let (proxy, ccm) = env.start_counted_ccm(&["--controllers=service"]).await?;
    wait_hostname(&env, &ccm, "web").await?;
    ccm.wait_synced(1, WAIT).await?;
    assert_eq!(mutations(&proxy), BTreeMap::new(), "logs:\n{}", ccm.logs());
    assert_eq!(idle_timeout_of(&c, &svc).await?, (Some("350".into()), None));
    drop(ccm);

    // The operator opts in. The Go CCM's listener lacks the cluster tag the
    // policy asks of a listener write: the plan says so and changes nothing.
    std::fs::write(&env.cloud_conf, listener_settings_conf(true))?;
    let plan = || crate::ops_orphans::run_tool(&env, "plan", &["--controllers=service"], "");
    let (ok, text, err) = plan().await?;
    assert!(ok, "aws-ccm plan failed: {err}");
    assert!(
        text.contains("ListenerUnauthorized") && !text.contains("set the attributes"),
        "{text}"
    );
    // Tagged as the Warning says: the plan shows the change before it is made.
    let lb = nlb_arn(&c, &svc).await?;
    let listeners = c.describe_listeners().load_balancer_arn(&lb).send().await?;
    let listener = listeners.listeners()[0].listener_arn().unwrap();
    let owned = format!("kubernetes.io/cluster/{CLUSTER_ID}");
    tag_by_hand(&c, listener, &owned, "owned").await?;
    let (ok, text, err) = plan().await?;
    assert!(ok, "aws-ccm plan failed: {err}");
    assert!(
        text.contains("~ set the attributes of listener 80: tcp.idle_timeout.seconds=400")
            && text.contains("~ tag the NLB with [\"aws-ccm/listener-attributes\"]"),
        "{text}"
    );
    assert_eq!(
        mutations(&env.proxy),
        BTreeMap::new(),
        "the plan wrote nothing"
    );
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    eventually("the timeout applied and recorded", WAIT, || async {
        let got = idle_timeout_of(&c, &svc).await.ok()?;
        (got == (
            Some("400".into()),
            Some("80:tcp.idle_timeout.seconds=400".into()),
        ))
            .then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    drop(ccm);
    env.finish().await
}

/// A new listener is invisible to ELBv2 for a moment after its create (the
/// fault proxy's consistency window): its ModifyListenerAttributes meets
/// `ListenerNotFound`, is sent again within the apply, and the timeout and
/// its record land with no failed sync.
#[tokio::test]
async fn listener_attributes_wait_out_a_new_listeners_consistency_window() -> anyhow::Result<()> {
    let (env, seeded, _, svc) = one_nlb_in(
        listener_settings_env().await?,
        serde_json::json!({ LISTENER_80: "tcp.idle_timeout.seconds=400" }),
    )
    .await?;
    env.proxy.set_consistency_delay(Duration::from_millis(1500));
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    wait_hostname(&env, &ccm, "web").await?;
    let c = via(&seeded, &env.proxy);
    let want = (
        Some("400".to_string()),
        Some("80:tcp.idle_timeout.seconds=400".to_string()),
    );
    wait_setting("idle timeout", want, || idle_timeout_of(&c, &svc))
        .await
        .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    let sent = env
        .proxy
        .calls()
        .get("elasticloadbalancingv2", "ModifyListenerAttributes");
    assert!(
        sent.received >= 2 && env.proxy.consistency_hits().not_found > 0,
        "the window hid the new listener from the first call: {sent:?}"
    );
    let failed = crate::routes::events_for(&env, "web", "SyncLoadBalancerFailed").await;
    assert!(failed.is_empty(), "{failed:?}\nlogs:\n{}", ccm.logs());
    drop(ccm);
    env.finish().await
}
