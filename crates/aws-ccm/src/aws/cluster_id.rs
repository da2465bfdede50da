//! Which cluster this is: the ID from cloud.conf, or from the tags of the
//! instance the CCM runs on (found through the instance metadata service),
//! by the Go CCM's rule (`findClusterIDs`, `awsTagging.init`).

use std::sync::Arc;

use anyhow::Context as _;

use crate::aws::Aws;
use crate::aws::client::clients::{self, SdkClients};
use crate::aws::client::door::Door;
use crate::aws::tags::{CLUSTER_TAG_PREFIX, LEGACY_CLUSTER_TAG};
use crate::cloud_config::CloudConfig;

/// The cluster ID: from cloud.conf, else from this instance's tags (found
/// through the instance metadata service), else empty when
/// `--allow-untagged-cloud` is set. The flag says whether it came from the
/// legacy `KubernetesCluster` tag (or `KubernetesClusterTag`); the text says
/// where the ID was found.
pub(crate) async fn resolve_cluster_id(
    cloud: &CloudConfig,
    sdk: &SdkClients,
    door: &Arc<Door>,
    opts: &crate::options::Options,
    allow_untagged: bool,
) -> anyhow::Result<(ClusterIdentity, String)> {
    if let Some(id) = cloud.cluster_id() {
        let key = if cloud.kubernetes_cluster_id.is_some() {
            "KubernetesClusterID"
        } else {
            "KubernetesClusterTag"
        };
        let identity = ClusterIdentity {
            id: id.to_string(),
            writes_legacy_tag: cloud.uses_legacy_tag(),
            legacy_only: cloud.cluster_id_is_legacy(),
        };
        return Ok((identity, format!("cloud.conf [Global] {key}")));
    }
    let discovered = async {
        let instance_id = clients::imds::instance_id(cloud.imds_endpoint())
            .await
            .map_err(anyhow::Error::msg)?;
        // The cluster ID is not known yet, so this one lookup goes through a
        // bootstrap client that owns no cluster resources.
        let bootstrap = Aws::with_door(
            sdk.clone(),
            String::new(),
            opts.aws_client_options(),
            opts.aws_settings(),
            door.clone(),
        );
        let instance = bootstrap
            .instance_by_id(&instance_id)
            .await
            .with_context(|| format!("looking up this instance {instance_id}"))?;
        Ok::<_, anyhow::Error>(instance)
    }
    .await;
    let discovered = match discovered {
        // Contradicting tags stop start-up even with --allow-untagged-cloud,
        // as upstream's init does.
        Ok(instance) => Ok(cluster_id_from_tags(instance.tags.iter())
            .map_err(anyhow::Error::msg)?
            .map(|found| {
                let tag = if found.writes_legacy_tag {
                    format!("{LEGACY_CLUSTER_TAG}={}", found.id)
                } else {
                    format!("{CLUSTER_TAG_PREFIX}{}", found.id)
                };
                let from = format!("the tag {tag} of this instance {}", instance.id);
                (found, from)
            })),
        Err(e) => Err(e),
    };
    match discovered {
        Ok(Some(found)) => Ok(found),
        Ok(None) | Err(_) if allow_untagged => {
            tracing::warn!("no cluster ID in cloud.conf or on this instance; running untagged (--allow-untagged-cloud) — resources cannot be attributed to this cluster");
            let identity = ClusterIdentity::default();
            Ok((identity, "none: --allow-untagged-cloud".to_string()))
        }
        Ok(None) => anyhow::bail!(
            "no cluster ID: set KubernetesClusterID in the [Global] section of cloud.conf, or tag this instance kubernetes.io/cluster/<cluster-id>=owned (or pass --allow-untagged-cloud)"
        ),
        Err(e) => Err(e.context(
            "no cluster ID in cloud.conf and it could not be read from this instance's tags: set KubernetesClusterID in the [Global] section of cloud.conf (or pass --allow-untagged-cloud)",
        )),
    }
}

/// How the cluster is identified, as the Go CCM's `awsTagging` decides it
/// (the default: untagged, no ID).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct ClusterIdentity {
    pub(crate) id: String,
    /// Upstream's `usesLegacyTags`: cloud.conf `KubernetesClusterTag`, or a
    /// `KubernetesCluster` tag on this instance (kOps puts it next to
    /// `kubernetes.io/cluster/<id>` on every instance). What this CCM
    /// creates then also carries `KubernetesCluster=<id>`.
    pub(crate) writes_legacy_tag: bool,
    /// Only the legacy tag identifies the cluster (no
    /// `kubernetes.io/cluster/<id>` seen): the instance sweep also queries
    /// the legacy tag.
    pub(crate) legacy_only: bool,
}

/// Upstream's rule (`findClusterIDs` and `awsTagging.init`): the legacy
/// `KubernetesCluster=<id>` tag, when present, gives the ID and turns on
/// the legacy tag; `kubernetes.io/cluster/<id>` otherwise. Two different
/// IDs, or two `kubernetes.io/cluster/` tags, are an error naming both.
fn cluster_id_from_tags<'a>(
    tags: impl Iterator<Item = (&'a str, &'a str)>,
) -> Result<Option<ClusterIdentity>, String> {
    let mut legacy: Option<&str> = None;
    let mut current: Option<&str> = None;
    for (key, value) in tags {
        if let Some(id) = key.strip_prefix(CLUSTER_TAG_PREFIX) {
            if let Some(first) = current.filter(|first| *first != id) {
                return Err(format!(
                    "this instance carries two cluster tags, {CLUSTER_TAG_PREFIX}{first} and {CLUSTER_TAG_PREFIX}{id}; remove the wrong one or set KubernetesClusterID in the [Global] section of cloud.conf"
                ));
            }
            current = Some(id).filter(|id| !id.is_empty());
        }
        if key == LEGACY_CLUSTER_TAG && !value.is_empty() {
            legacy = Some(value);
        }
    }
    Ok(match (legacy, current) {
        (Some(old), Some(new)) if old != new => {
            return Err(format!(
                "this instance's cluster tags do not match: {LEGACY_CLUSTER_TAG}={old} and {CLUSTER_TAG_PREFIX}{new}; make them name one cluster or set KubernetesClusterID in the [Global] section of cloud.conf"
            ));
        }
        (Some(old), current) => Some(ClusterIdentity {
            id: old.to_string(),
            writes_legacy_tag: true,
            legacy_only: current.is_none(),
        }),
        (None, Some(new)) => Some(ClusterIdentity {
            id: new.to_string(),
            writes_legacy_tag: false,
            legacy_only: false,
        }),
        (None, None) => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(id: &str, writes_legacy_tag: bool, legacy_only: bool) -> ClusterIdentity {
        ClusterIdentity {
            id: id.into(),
            writes_legacy_tag,
            legacy_only,
        }
    }

    #[test]
    fn cluster_id_from_instance_tags_follows_upstream() {
        // kOps: both tags, one name. The legacy tag turns on writing it.
        let kops = [
            ("KubernetesCluster", "k.example.com"),
            ("kubernetes.io/cluster/k.example.com", "owned"),
            ("Name", "x"),
        ];
        assert_eq!(
            cluster_id_from_tags(kops.iter().copied()),
            Ok(Some(identity("k.example.com", true, false)))
        );
        let tags = [("KubernetesCluster", "old")];
        assert_eq!(
            cluster_id_from_tags(tags.iter().copied()),
            Ok(Some(identity("old", true, true)))
        );
        let tags = [("kubernetes.io/cluster/new", "owned")];
        assert_eq!(
            cluster_id_from_tags(tags.iter().copied()),
            Ok(Some(identity("new", false, false)))
        );
        assert_eq!(
            cluster_id_from_tags([("Name", "x")].iter().copied()),
            Ok(None)
        );
    }

    #[test]
    fn contradicting_cluster_tags_are_refused_naming_both() {
        let tags = [
            ("KubernetesCluster", "old"),
            ("kubernetes.io/cluster/new", "owned"),
        ];
        let err = cluster_id_from_tags(tags.iter().copied()).unwrap_err();
        assert!(
            err.contains("KubernetesCluster=old") && err.contains("kubernetes.io/cluster/new"),
            "{err}"
        );
        let tags = [
            ("kubernetes.io/cluster/a", "owned"),
            ("kubernetes.io/cluster/b", "shared"),
        ];
        let err = cluster_id_from_tags(tags.iter().copied()).unwrap_err();
        assert!(
            err.contains("kubernetes.io/cluster/a") && err.contains("kubernetes.io/cluster/b"),
            "{err}"
        );
    }
}
