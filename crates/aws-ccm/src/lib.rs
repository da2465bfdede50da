//! aws-ccm: a Kubernetes cloud-controller-manager for AWS.
//!
//! The binary `aws-cloud-controller-manager` is a drop-in replacement for the Go
//! `aws-cloud-controller-manager` from kubernetes/cloud-provider-aws. See README.md
//! for the flow of data and the layout.

pub mod aws;
pub mod backoff;
pub mod cloud_config;
pub mod controllers;
pub mod duration;
pub mod ids;
pub mod kube_client;
pub mod leader;
pub mod logging;
pub mod manager;
pub mod metrics;
pub mod ops;
pub mod options;
pub mod provider;
pub mod server;
pub mod target_record;
