//! The operator tool `aws-ccm` (binary `src/bin/aws-ccm.rs`): questions an
//! operator asks about a cluster, answered with the CCM's own code.
//!
//! - [`orphans`]: what the CCM left behind in AWS, and its deletion;
//! - [`plan`]: what the controllers would change in AWS now;
//! - [`doctor`]: why a cluster is not working, one check at a time.
//!
//! The tool takes the CCM's flags with their meaning (`--cloud-config`,
//! `--kubeconfig`, `--cluster-cidr`, ...), parsed by [`crate::options`], and
//! reaches AWS through the same one door ([`crate::aws::Aws`]),
//! region and cluster ID resolved as the CCM resolves them.

use std::sync::Arc;

use crate::aws::Aws;
use crate::cloud_config::CloudConfig;
use crate::kube_client;
use crate::options::Validated;
use crate::options::controller_names::ControllerName;

pub mod doctor;
pub mod orphans;
pub mod plan;

/// What every subcommand works with.
#[derive(Clone)]
pub struct Context {
    pub aws: Aws,
    pub kube: kube::Client,
    cloud: Arc<CloudConfig>,
    validated: Arc<Validated>,
    pub cluster_id: String,
    region: String,
    /// How the region was found (cloud.conf, or instance metadata).
    region_from: String,
    /// How the cluster ID was found (cloud.conf, or a tag of this instance).
    cluster_id_from: String,
}

impl Context {
    /// cloud.conf, AWS (region and cluster ID) and the Kubernetes client,
    /// as the CCM sets them up.
    pub async fn connect(validated: Validated) -> anyhow::Result<Context> {
        let opts = &validated.options;
        let cloud = crate::manager::load_cloud_config(opts)?;
        let connected = crate::manager::connect_aws_described(&cloud, opts).await?;
        let kube_config =
            kube_client::load_config(opts.kubeconfig.as_deref(), opts.master.as_deref()).await?;
        let kube = kube_client::build_client(kube_config, opts.kube_api_qps, opts.kube_api_burst)?;
        Ok(Context {
            aws: connected.aws,
            kube,
            cloud: Arc::new(cloud),
            validated: Arc::new(validated),
            cluster_id: connected.cluster_id,
            region: connected.region,
            region_from: connected.region_from,
            cluster_id_from: connected.cluster_id_from,
        })
    }

    /// The route tables and CIDRs the route controller works on; `None`
    /// when it would not run (routes off, or no `--cluster-cidr`).
    pub fn route_scope(&self) -> Option<orphans::RouteScope> {
        let v = &self.validated;
        if !v.options.configure_cloud_routes || !v.controllers.contains(&ControllerName::Route) {
            return None;
        }
        Some(orphans::RouteScope {
            selector: crate::controllers::route::table_selector(&self.cloud, &self.cluster_id),
            cluster_cidrs: v.cluster_cidrs.clone()?,
        })
    }
}

/// Output format of a subcommand (`-o`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Lines for people.
    #[default]
    Text,
    /// The same as data.
    Json,
}

/// `1d2h`, `3h4m`, `5m6s`, `7s`: an age, to the two largest units.
pub fn short_age(d: std::time::Duration) -> String {
    let s = d.as_secs();
    let (days, hours, mins, secs) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    if days > 0 {
        format!("{days}d{hours}h")
    } else if hours > 0 {
        format!("{hours}h{mins}m")
    } else if mins > 0 {
        format!("{mins}m{secs}s")
    } else {
        format!("{secs}s")
    }
}

#[cfg(test)]
mod tests {
    use super::short_age;
    use std::time::Duration;

    #[test]
    fn ages_show_the_two_largest_units() {
        assert_eq!(short_age(Duration::from_secs(7)), "7s");
        assert_eq!(short_age(Duration::from_secs(366)), "6m6s");
        assert_eq!(short_age(Duration::from_secs(3 * 3600 + 240)), "3h4m");
        assert_eq!(short_age(Duration::from_secs(86_400 + 7200 + 5)), "1d2h");
    }
}
