//! End-to-end tests of the real `aws-cloud-controller-manager` binary, run as
//! a subprocess against the project's Kubernetes API test server and moto.
//! One test target (one link) holds every scenario; each lives in its module.

#[path = "../common/ipv6.rs"]
mod ipv6;
#[path = "../common/sg_rules.rs"]
mod sg_rules;
mod support;

mod adopt;
mod backends;
mod chaos;
mod clb;
mod credentials;
mod foundation;
mod harsh;
mod iam;
mod kops;
mod lb_permissions;
mod nlb;
mod nlb_settings;
mod node;
mod observability;
mod ops_doctor;
mod ops_orphans;
mod ops_plan;
mod permissions;
mod protect;
mod routes;
mod rule_counts;
mod service;
mod shared_group;
mod swap;
mod sweep;
mod tolerance;
