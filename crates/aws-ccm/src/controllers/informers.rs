//! The shared informers (one watch per kind, slimmed before caching) and
//! the loop that starts every enabled controller on them.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::ResourceExt;
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::de::DeserializeOwned;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use super::cached_node::Node;
use super::node::changes::Feed;
use super::{ControllerContext, Environment};
use super::{node, node_ipam, node_lifecycle, route, service, tagging};
use crate::options::controller_names::ControllerName;
use crate::provider::Cloud;

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Node conditions a controller reads: `Ready` (node lifecycle) and
/// `NetworkUnavailable` (routes). The kubelet's pressure conditions are
/// dropped.
const KEPT_CONDITIONS: [&str; 2] = ["Ready", "NetworkUnavailable"];

/// Node annotations a controller reads: the kubelet's `--node-ip` (node
/// addresses). Kubelets, kubeadm, CSI drivers and CNI plugins add many more.
const KEPT_NODE_ANNOTATIONS: [&str; 1] = [node::plan::PROVIDED_NODE_IP_ANNOTATION];

/// Keeps of a Node, before it is cached, only what some controller reads.
/// The cached [`Node`] type already leaves out every status field but
/// addresses and conditions (images, often half a Node's size, volumes,
/// capacity, nodeInfo, ...); here the conditions are cut to the
/// [`KEPT_CONDITIONS`], and `managedFields` and every annotation but the
/// [`KEPT_NODE_ANNOTATIONS`] are dropped. Labels are kept whole:
/// `target-node-labels` may name any of them.
/// At 5,000 nodes the cache is most of the CCM's memory. Every Node write
/// is a merge or strategic patch of named fields, so nothing dropped here
/// is ever written back.
fn slim_node(node: &mut Node) {
    node.metadata.managed_fields = None;
    if let Some(mut annotations) = node.metadata.annotations.take() {
        annotations.retain(|k, _| KEPT_NODE_ANNOTATIONS.contains(&k.as_str()));
        node.metadata.annotations = (!annotations.is_empty()).then_some(annotations);
    }
    if let Some(conditions) = node.status.as_mut().and_then(|s| s.conditions.as_mut()) {
        conditions.retain(|c| KEPT_CONDITIONS.contains(&c.type_.as_str()));
    }
}

/// The same for a Service: `managedFields` and kubectl's last-applied copy.
fn slim_service(svc: &mut Service) {
    svc.metadata.managed_fields = None;
    if let Some(annotations) = svc.metadata.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
}

/// Nodes per list page. A page is read and parsed whole before
/// [`slim_node`] sees it, and kubelet-written Nodes run 10-50 KB each: 100
/// keeps that transient near a few MB where kube's default of 500 made it
/// 5-25 MB. 5,000 Nodes take 50 list calls instead of 10, once per relist.
const NODE_LIST_PAGE: u32 = 100;

/// Starts the shared informers, waits for their first list, then runs every
/// enabled controller until `stop` is cancelled. `ready` turns true once the
/// caches have synced.
pub(crate) async fn run_all<C: Cloud>(
    env: Environment<C>,
    ready: Arc<AtomicBool>,
    stop: CancellationToken,
) {
    let kube = env.kube.clone();
    let (nodes, node_writer) = reflector::store();
    let (services, service_writer) = reflector::store();
    let (node_changed, node_changes) = watch::channel(0u64);
    let (service_changed, service_changes) = watch::channel(0u64);
    let (node_feed, _) = broadcast::channel(node::changes::FEED_CAPACITY);
    let node_informer = informer(
        Api::<Node>::all(kube.clone()),
        watcher::Config::default().page_size(NODE_LIST_PAGE),
        node_writer,
        slim_node,
        (node_changed, Some(node_feed.clone())),
    );
    let service_informer = informer(
        Api::<Service>::all(kube),
        watcher::Config::default(),
        service_writer,
        slim_service,
        (service_changed, None),
    );
    let informers = tokio::spawn({
        let stop = stop.clone();
        async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = futures::future::join(node_informer, service_informer) => {}
            }
        }
    });

    let synced = async {
        let (n, s) = tokio::join!(nodes.wait_until_ready(), services.wait_until_ready());
        n.is_ok() && s.is_ok()
    };
    tokio::select! {
        _ = stop.cancelled() => { let _ = informers.await; return; }
        ok = synced => if !ok { tracing::error!("informer caches closed before syncing"); return; }
    }
    ready.store(true, Ordering::Relaxed);
    tracing::info!(
        nodes = nodes.len(),
        services = services.len(),
        "caches synced"
    );
    let ctx = ControllerContext {
        env,
        nodes,
        services,
        node_changes,
        node_feed,
        service_changes,
    };
    run_controllers(ctx, stop).await;
    let _ = informers.await;
    ready.store(false, Ordering::Relaxed);
}

/// One kind's informer: lists and watches through `api`, slims each object
/// before the store keeps it, and after every event bumps `changed` and
/// names what it touched on the feed, if there is one.
fn informer<K>(
    api: Api<K>,
    config: watcher::Config,
    writer: reflector::store::Writer<K>,
    slim: fn(&mut K),
    (changed, feed): (watch::Sender<u64>, Option<Feed>),
) -> impl std::future::Future<Output = ()> + Send
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    reflector::reflector(writer, watcher(api, config).modify(slim))
        .default_backoff()
        .for_each(move |event| {
            if let (Some(feed), Ok(event)) = (&feed, &event) {
                let touched = match event {
                    watcher::Event::Apply(o) | watcher::Event::Delete(o) => {
                        Some(Some(Arc::from(o.name_any())))
                    }
                    // The store is swapped whole when a relist is done.
                    watcher::Event::InitDone => Some(None),
                    watcher::Event::Init | watcher::Event::InitApply(_) => None,
                };
                // No reader yet is no error: a reader diffs the whole
                // store when it starts.
                if let Some(touched) = touched {
                    let _ = feed.send(touched);
                }
            }
            changed.send_modify(|n| *n = n.wrapping_add(1));
            futures::future::ready(())
        })
}

/// `aws_ccm_controller_running{controller}`: 1 from a controller's start
/// to its stop in this process (the leader's; a standby has no series), 0
/// once it stopped.
static RUNNING: std::sync::LazyLock<Family<crate::metrics::Labels, Gauge>> =
    std::sync::LazyLock::new(|| {
        crate::metrics::registered(
            "aws_ccm_controller_running",
            "1 while the controller runs in this process, 0 once it stopped",
            Family::default(),
        )
    });

/// Runs every enabled controller on the synced caches until each stops.
async fn run_controllers<C: Cloud>(ctx: ControllerContext<C>, stop: CancellationToken) {
    if ctx.options.options.allocate_node_cidrs
        && !ctx.options.controllers.contains(&ControllerName::NodeIpam)
    {
        tracing::info!(
            "--allocate-node-cidrs=true, but node IPAM is not running: it runs only when --controllers \
             names nodeipam (the Go CCM has no IPAM controller; kube-controller-manager allocates pod CIDRs)"
        );
    }
    let mut tasks = Vec::new();
    for name in ctx.options.controllers.iter().copied() {
        let ctx = ctx.clone();
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let running = RUNNING
                .get_or_create(&vec![("controller", name.to_string())])
                .clone();
            tracing::info!(controller = %name, "starting controller");
            running.set(1);
            run_controller(name, ctx, stop).await;
            running.set(0);
            tracing::info!(controller = %name, "controller stopped");
        }));
    }
    futures::future::join_all(tasks).await;
}

/// The slot each controller runs in.
async fn run_controller<C: Cloud>(
    name: ControllerName,
    ctx: ControllerContext<C>,
    stop: CancellationToken,
) {
    match name {
        ControllerName::CloudNode => node::run(ctx, stop).await,
        ControllerName::CloudNodeLifecycle => node_lifecycle::run(ctx, stop).await,
        ControllerName::Tagging => tagging::run(ctx, stop).await,
        ControllerName::Route => route::run(ctx, stop).await,
        ControllerName::NodeIpam => node_ipam::run(ctx, stop).await,
        ControllerName::Service => service::run(ctx, stop).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only what no controller reads is dropped: the rest of the Node is
    /// exactly as the apiserver sent it.
    #[test]
    fn slim_node_drops_only_what_no_controller_reads() {
        let kept = serde_json::json!({
            "metadata": {"name": "n1", "resourceVersion": "7", "uid": "u1",
                         "labels": {"node.kubernetes.io/instance-type": "m5.large"},
                         "annotations": {"alpha.kubernetes.io/provided-node-ip": "10.0.0.1"}},
            "spec": {"providerID": "aws:///us-east-1a/i-1", "podCIDR": "10.1.0.0/24",
                     "taints": [{"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"}]},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"},
                                      {"type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated"}]},
        });
        let mut full = kept.clone();
        full["status"]["conditions"] = serde_json::json!([
            {"type": "MemoryPressure", "status": "False"},
            {"type": "Ready", "status": "True", "reason": "KubeletReady"},
            {"type": "DiskPressure", "status": "False"},
            {"type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated"}]);
        full["status"]["nodeInfo"] = serde_json::json!({"kubeletVersion": "v1.31.0", "architecture": "amd64", "bootID": "",
            "containerRuntimeVersion": "", "kernelVersion": "", "kubeProxyVersion": "", "machineID": "",
            "operatingSystem": "linux", "osImage": "", "systemUUID": ""});
        full["status"]["capacity"] =
            serde_json::json!({"cpu": "2", "memory": "7910660Ki", "pods": "29"});
        full["status"]["allocatable"] =
            serde_json::json!({"cpu": "2", "memory": "7910660Ki", "pods": "29"});
        full["status"]["daemonEndpoints"] = serde_json::json!({"kubeletEndpoint": {"Port": 10250}});
        full["metadata"]["managedFields"] = serde_json::json!([{"manager": "kubelet", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}}]);
        full["metadata"]["annotations"][LAST_APPLIED] = "{}".into();
        full["metadata"]["annotations"]["node.alpha.kubernetes.io/ttl"] = "0".into();
        full["metadata"]["annotations"]["csi.volume.kubernetes.io/nodeid"] =
            r#"{"ebs.csi.aws.com":"i-1"}"#.into();
        full["status"]["images"] =
            serde_json::json!([{"names": ["registry.k8s.io/pause:3.10"], "sizeBytes": 320368}]);
        full["status"]["volumesInUse"] = serde_json::json!(["kubernetes.io/csi/ebs^vol-1"]);
        full["status"]["volumesAttached"] =
            serde_json::json!([{"name": "kubernetes.io/csi/ebs^vol-1", "devicePath": ""}]);
        let mut node: Node = serde_json::from_value(full).unwrap();
        slim_node(&mut node);
        let want: Node = serde_json::from_value(kept).unwrap();
        assert_eq!(node, want);

        let mut svc: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "s", "annotations": {LAST_APPLIED: "{}", "service.beta.kubernetes.io/aws-load-balancer-type": "nlb"},
                         "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": {"type": "LoadBalancer"},
        }))
        .unwrap();
        slim_service(&mut svc);
        let want: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "s", "annotations": {"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"}},
            "spec": {"type": "LoadBalancer"},
        }))
        .unwrap();
        assert_eq!(svc, want);
    }
}
