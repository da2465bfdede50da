//! The real binary, run as the kubelet runs it, against moto's ECR and STS
//! and the fault proxy's ECR Public, every call through the fault proxy.
//! Each response is decoded with the kubelet's v1 schema (support/kubelet.rs).

mod answers;
mod bad_answers;
mod faults;
mod hosts;
mod secrets;
mod support;
