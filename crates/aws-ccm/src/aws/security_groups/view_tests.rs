//! The view's records of this process's own writes, against listings.

use super::*;
use crate::aws::security_groups::Source;

const VPC: &str = "vpc-1";

fn group(id: &str, rules: &[Rule]) -> SecurityGroup {
    SecurityGroup {
        id: id.into(),
        name: format!("name-{id}"),
        vpc_id: Some(VPC.into()),
        tags: BTreeMap::new(),
        ingress: rules.iter().cloned().collect(),
        descriptions: BTreeMap::new(),
        owner_id: None,
    }
}

fn cidr_rule(port: i32) -> Rule {
    Rule {
        protocol: "tcp".into(),
        from: port,
        to: port,
        source: Source::Cidr("10.0.0.0/16".parse().unwrap()),
    }
}

fn listing(started: Instant, groups: &[SecurityGroup]) -> Arc<Listing> {
    Arc::new(Listing {
        started,
        groups: groups.iter().map(|g| (g.id.clone(), g.clone())).collect(),
    })
}

/// The view as a sync sees it over `l`.
fn seen(view: &SgView, l: &Arc<Listing>) -> Groups {
    view.last.lock().insert(VPC.into(), l.clone());
    let over = overlay(&mut view.local.lock(), l, VPC, WRITE_SETTLE);
    Groups {
        listing: l.clone(),
        over,
    }
}

#[tokio::test(start_paused = true)]
async fn a_rule_this_process_adds_or_revokes_is_seen_over_an_older_listing() {
    let view = SgView::default();
    let old = listing(Instant::now(), &[group("sg-1", &[cidr_rule(80)])]);
    seen(&view, &old);
    let added = BTreeSet::from([cidr_rule(443)]);
    let described = BTreeMap::from([(cidr_rule(443), "ours".to_string())]);
    view.authorized("sg-1", &added, &described);
    let g = seen(&view, &old);
    let sg1 = g.get("sg-1").unwrap();
    assert!(sg1.ingress.contains(&cidr_rule(443)) && sg1.ingress.contains(&cidr_rule(80)));
    assert_eq!(
        sg1.descriptions.get(&cidr_rule(443)).map(String::as_str),
        Some("ours")
    );
    assert_eq!(g.with_rule_ports(&BTreeSet::from([443])).len(), 1);

    view.revoked("sg-1", &BTreeSet::from([cidr_rule(80)]));
    let g = seen(&view, &old);
    assert!(!g.get("sg-1").unwrap().ingress.contains(&cidr_rule(80)));
    assert!(g.with_rule_ports(&BTreeSet::from([80])).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_listing_that_started_soon_after_a_write_does_not_replace_it_a_later_one_does() {
    let view = SgView::default();
    seen(&view, &listing(Instant::now(), &[group("sg-1", &[])]));
    view.authorized("sg-1", &BTreeSet::from([cidr_rule(443)]), &BTreeMap::new());
    // Eventually consistent: a listing just after the write may lack it.
    tokio::time::advance(WRITE_SETTLE / 2).await;
    let soon = listing(Instant::now(), &[group("sg-1", &[])]);
    assert!(
        seen(&view, &soon)
            .get("sg-1")
            .unwrap()
            .ingress
            .contains(&cidr_rule(443))
    );
    // Well after: the listing answers (here someone revoked it since).
    tokio::time::advance(WRITE_SETTLE).await;
    let later = listing(Instant::now(), &[group("sg-1", &[])]);
    assert!(seen(&view, &later).get("sg-1").unwrap().ingress.is_empty());
    assert!(view.local.lock().is_empty(), "the record is dropped");
}

#[tokio::test(start_paused = true)]
async fn a_group_made_here_is_seen_until_a_listing_shows_it_and_a_deleted_one_is_gone() {
    let view = SgView::default();
    let before = listing(Instant::now(), &[group("sg-old", &[])]);
    seen(&view, &before);
    view.created(group("sg-new", &[]));
    view.deleted("sg-old");
    tokio::time::advance(WRITE_SETTLE * 2).await;
    // Not listed yet (eventual consistency): still known.
    let lagging = listing(Instant::now(), &[]);
    assert!(seen(&view, &lagging).get("sg-new").is_some());
    // Listed: the listing answers from here on.
    let caught_up = listing(Instant::now(), &[group("sg-new", &[cidr_rule(1)])]);
    let g = seen(&view, &caught_up);
    assert!(g.get("sg-new").unwrap().ingress.contains(&cidr_rule(1)));
    assert!(g.get("sg-old").is_none());
}

#[tokio::test(start_paused = true)]
async fn a_deleted_group_is_gone_over_a_listing_that_still_shows_it() {
    let view = SgView::default();
    let l = listing(Instant::now(), &[group("sg-1", &[])]);
    seen(&view, &l);
    view.deleted("sg-1");
    let g = seen(&view, &l);
    assert!(g.get("sg-1").is_none() && g.knows("sg-1"));
    assert_eq!(g.iter().count(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_failed_write_or_a_write_to_a_group_never_listed_makes_it_unknown() {
    let view = SgView::default();
    let l = listing(Instant::now(), &[group("sg-1", &[cidr_rule(80)])]);
    seen(&view, &l);
    view.unknown("sg-1");
    view.authorized("sg-2", &BTreeSet::from([cidr_rule(80)]), &BTreeMap::new());
    let g = seen(&view, &l);
    assert!(g.get("sg-1").is_none() && g.get("sg-2").is_none());
    let local = view.local.lock();
    assert!(
        ["sg-1", "sg-2"]
            .iter()
            .all(|id| matches!(local.get(*id).map(|l| &l.entry), Some(Entry::Unknown)))
    );
}

#[tokio::test(start_paused = true)]
async fn a_resync_needs_a_listing_newer_than_the_services_last_sync() {
    let view = SgView::default();
    let period = Duration::from_secs(60);
    let due = |uid: &str| view.slot_due(uid, VPC, Some(period));
    seen(&view, &listing(Instant::now(), &[]));
    tokio::time::advance(Duration::from_secs(1)).await;
    let first = Instant::now();
    assert_eq!(due("uid-1"), None, "first sync");
    assert_eq!(due("uid-1"), None, "same slot");
    tokio::time::advance(period).await;
    assert_eq!(due("uid-1"), Some(first), "next slot, the listing is older");
    assert_eq!(due("uid-1"), None, "once per slot");
    // A listing newer than the Service's last sync serves its resync.
    tokio::time::advance(Duration::from_secs(1)).await;
    seen(&view, &listing(Instant::now(), &[]));
    tokio::time::advance(period).await;
    assert_eq!(due("uid-1"), None, "the newer listing serves");
    assert_eq!(view.slot_due("uid-2", VPC, None), None, "no resync period");
    assert_eq!(view.slot_due("uid-2", VPC, None), None);
}
