//! Signs that something else assigns pod CIDRs in this cluster, most often
//! kube-controller-manager with `--allocate-node-cidrs=true` (kOps passes the
//! flag to it and to the CCM alike). Two allocators can give one CIDR to two
//! nodes, so on any sign node IPAM stops allocating (the other controllers
//! keep running) and says why.
//!
//! What tells, and why it is reliable: the kubelet never sets `podCIDR`, so
//! a CIDR this controller did not write came from another allocator (or a
//! person). Before allocating, every start takes a consistent list of the
//! nodes; from then on every CIDR it writes is recorded first. So:
//! - a CIDR outside `--cluster-cidr` at start: someone allocates from
//!   another range;
//! - after that list, a node showing CIDRs this controller did not write, or
//!   a node whose CIDRs change: someone allocates right now;
//! - a patch that lost to another writer's CIDRs: the same, caught in the act.

use std::fmt;

use ipnet::IpNet;

/// What was seen, on which node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtherAllocator {
    pub node: String,
    pub cidrs: Vec<IpNet>,
    pub sign: Sign,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sign {
    /// At start, a CIDR outside every `--cluster-cidr`.
    OutsideClusterCidr,
    /// After start, CIDRs this controller did not write.
    AssignedByOther,
    /// Our patch found another writer's CIDRs already there.
    LostRace,
}

impl fmt::Display for OtherAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cidrs = self
            .cidrs
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let what = match self.sign {
            Sign::OutsideClusterCidr => "which lie outside --cluster-cidr",
            Sign::AssignedByOther => "which this controller did not assign",
            Sign::LostRace => "written by someone else while this controller was assigning it",
        };
        write!(
            f,
            "another pod CIDR allocator is at work: node {} holds {cidrs}, {what}. Node IPAM stops \
             allocating so that no CIDR is given twice (the other controllers keep running). If \
             kube-controller-manager runs with --allocate-node-cidrs=true, leave allocation to it \
             and drop nodeipam from --controllers; to use this allocator instead, turn it off there \
             and restart this CCM",
            self.node
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_node_cidrs_sign_and_fix() {
        let seen = OtherAllocator {
            node: "n7".into(),
            cidrs: vec!["10.96.3.0/24".parse().unwrap()],
            sign: Sign::OutsideClusterCidr,
        };
        let text = seen.to_string();
        for part in [
            "n7",
            "10.96.3.0/24",
            "outside --cluster-cidr",
            "kube-controller-manager",
            "nodeipam",
        ] {
            assert!(text.contains(part), "{text} lacks {part}");
        }
    }
}

/// The guard inside the allocator: a consistent start-up list, then syncs.
#[cfg(test)]
mod ipam_tests {
    use kube::Api;
    use kube::api::{Patch, PatchParams};
    use serde_json::json;

    use super::super::{Ipam, pod_cidrs};
    use super::Sign;
    use crate::controllers::cached_node::Node;
    use crate::controllers::events::Events;
    use crate::options::cidrs::{self, NodeCidrAllocation};
    use ccm_testkit::apiserver::TestApiServer;

    use super::super::tests::{net, node};

    async fn ipam(server: &TestApiServer) -> anyhow::Result<(Ipam, Api<Node>)> {
        let client = server.client().await?;
        let cluster = cidrs::ClusterCidrs::parse("10.244.0.0/16", "--allocate-node-cidrs=true")?;
        let config = NodeCidrAllocation::new(cluster, cidrs::MaskFlags::default())?;
        let api: Api<Node> = Api::all(client.clone());
        Ok((
            Ipam::new(config, api.clone(), Events::new(client, "test")),
            api,
        ))
    }

    async fn cached(api: &Api<Node>) -> anyhow::Result<Vec<std::sync::Arc<Node>>> {
        let list = api.list(&Default::default()).await?;
        Ok(list.items.into_iter().map(std::sync::Arc::new).collect())
    }

    async fn with_cidr(api: &Api<Node>, name: &str, cidr: &str) -> anyhow::Result<()> {
        node(api, name).await;
        api.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"podCIDR": cidr, "podCIDRs": [cidr]}})),
        )
        .await?;
        Ok(())
    }

    #[tokio::test]
    async fn a_cidr_outside_the_cluster_cidr_at_start_stops_allocation() -> anyhow::Result<()> {
        let server = TestApiServer::start().await?;
        let (mut ipam, api) = ipam(&server).await?;
        with_cidr(&api, "kcm-made", "10.96.3.0/24").await?;
        node(&api, "bare").await;
        ipam.rebuild().await?;
        let other = ipam.other.clone().expect("another allocator seen");
        assert_eq!(
            (other.node.as_str(), other.sign),
            ("kcm-made", Sign::OutsideClusterCidr)
        );
        ipam.sync(&cached(&api).await?).await;
        assert!(
            pod_cidrs(&api.get("bare").await?).is_empty(),
            "nothing allocated"
        );
        server.shutdown().await;
        Ok(())
    }

    #[tokio::test]
    async fn cidrs_assigned_by_someone_else_after_start_stop_allocation() -> anyhow::Result<()> {
        let server = TestApiServer::start().await?;
        let (mut ipam, api) = ipam(&server).await?;
        // Inside the range and present at start: fine (a previous leader).
        with_cidr(&api, "before", "10.244.0.0/24").await?;
        ipam.rebuild().await?;
        assert!(ipam.other.is_none());
        // Then another allocator gives a new node a CIDR; a bare node waits.
        with_cidr(&api, "after", "10.244.1.0/24").await?;
        node(&api, "bare").await;
        ipam.sync(&cached(&api).await?).await;
        let other = ipam.other.clone().expect("another allocator seen");
        assert_eq!(
            (other.node.as_str(), other.sign),
            ("after", Sign::AssignedByOther)
        );
        assert!(
            pod_cidrs(&api.get("bare").await?).is_empty(),
            "nothing allocated"
        );
        server.shutdown().await;
        Ok(())
    }

    #[tokio::test]
    async fn without_another_allocator_nodes_are_allocated() -> anyhow::Result<()> {
        let server = TestApiServer::start().await?;
        let (mut ipam, api) = ipam(&server).await?;
        with_cidr(&api, "before", "10.244.0.0/24").await?;
        ipam.rebuild().await?;
        node(&api, "bare").await;
        ipam.sync(&cached(&api).await?).await;
        assert!(ipam.other.is_none());
        assert_eq!(pod_cidrs(&api.get("bare").await?), [net("10.244.1.0/24")]);
        // Our own write, seen back through the cache, is not another allocator.
        ipam.sync(&cached(&api).await?).await;
        assert!(ipam.other.is_none());
        server.shutdown().await;
        Ok(())
    }
}
