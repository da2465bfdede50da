//! aws-ccm: a Kubernetes cloud-controller-manager for AWS.
//!
//! The binary `aws-cloud-controller-manager` is a drop-in replacement for the Go
//! `aws-cloud-controller-manager` from kubernetes/cloud-provider-aws. See README.md
//! for the flow of data and the layout.
//!
//! The modules and items marked `pub` are what the binaries, the tests, the
//! bench and the test tools (ccm-testkit) use; everything else is
//! `pub(crate)` or private, so a module's `pub` items are what it offers
//! outside the crate. `unreachable_pub` keeps it so: an item `pub` in a
//! module the outside cannot reach is a warning (and CI fails on warnings).
#![warn(unreachable_pub)]
// Data from AWS, the apiserver or a user never panics the CCM: outside
// tests, no unwrap, expect or panic (CI's clippy denies them).
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod aws;
pub(crate) mod backoff;
pub mod cloud_config;
pub mod controllers;
pub(crate) mod duration;
pub mod ids;
pub(crate) mod kube_client;
pub mod leader;
pub mod logging;
pub mod manager;
pub mod metrics;
pub mod ops;
pub mod options;
pub mod provider;
pub mod server;
pub mod target_record;
