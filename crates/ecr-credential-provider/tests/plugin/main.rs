//! The real binary, run as the kubelet runs it, against moto's ECR and STS
//! and the fault proxy's ECR Public, every call through the fault proxy.
//! Each response is decoded with the kubelet's v1 schema (support/kubelet.rs).

mod answers;
mod bad_answers;
mod faults;
mod hosts;
mod secrets;
mod stand_in;
mod support;

/// The test's copy of the kubelet's duration parser is itself right.
#[test]
fn go_durations_parse_as_go_does() {
    assert_eq!(
        support::kubelet::parse_go_duration("6h0m0s"),
        Some(std::time::Duration::from_secs(21_600))
    );
    assert_eq!(
        support::kubelet::parse_go_duration("1m30s"),
        Some(std::time::Duration::from_secs(90))
    );
    assert_eq!(
        support::kubelet::parse_go_duration("0s"),
        Some(std::time::Duration::ZERO)
    );
    assert_eq!(
        support::kubelet::parse_go_duration("0"),
        Some(std::time::Duration::ZERO)
    );
    assert_eq!(
        support::kubelet::parse_go_duration("1.5s"),
        Some(std::time::Duration::from_millis(1500))
    );
    assert_eq!(support::kubelet::parse_go_duration("-1s"), None);
    assert_eq!(support::kubelet::parse_go_duration("6h0m0"), None);
    assert_eq!(support::kubelet::parse_go_duration(""), None);
    assert_eq!(support::kubelet::parse_go_duration("PT6H"), None);
}
