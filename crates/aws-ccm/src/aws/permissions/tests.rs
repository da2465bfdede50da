use super::*;

#[test]
fn tagging_reads_the_current_and_the_legacy_tag() {
    assert_eq!(
        Tagging::of(
            "demo",
            [
                ("kubernetes.io/cluster/demo", ""),
                ("KubernetesCluster", "demo")
            ]
        ),
        Tagging::Current
    );
    assert_eq!(
        Tagging::of("demo", [("KubernetesCluster", "demo")]),
        Tagging::LegacyOnly
    );
    assert_eq!(
        Tagging::of(
            "demo",
            [
                ("KubernetesCluster", "other"),
                ("kubernetes.io/cluster/other", "owned")
            ]
        ),
        Tagging::Untagged
    );
}

#[test]
fn arns_carry_partition_region_and_account() {
    let p = Permissions::new("demo", "cn-north-1", DEFAULT_TTL);
    assert_eq!(
        p.arn(Action::CreateRoute, "rtb-1"),
        "arn:aws-cn:ec2:cn-north-1:<account-id>:route-table/rtb-1"
    );
    p.learn_account(Some("123456789012"));
    p.learn_account(Some("999999999999"));
    assert_eq!(
        p.arn(Action::ModifyInstanceAttribute, "i-1"),
        "arn:aws-cn:ec2:cn-north-1:123456789012:instance/i-1"
    );
    assert_eq!(partition("us-gov-west-1"), "aws-us-gov");
    assert_eq!(partition("eu-west-1"), "aws");
}

#[test]
fn a_denial_names_action_arn_missing_tag_and_the_fix() {
    let p = Permissions::new("demo", "us-east-1", DEFAULT_TTL);
    p.learn_account(Some("123456789012"));
    let text = p
        .record_denied(Action::CreateRoute, "rtb-9", Tagging::Untagged)
        .to_string();
    for needle in [
        "ec2:CreateRoute",
        "arn:aws:ec2:us-east-1:123456789012:route-table/rtb-9",
        "lacks the cluster tag",
        "kubernetes.io/cluster/demo=owned",
        "iam/render.sh --route-table rtb-9",
    ] {
        assert!(text.contains(needle), "{needle} in {text}");
    }
    let text = p
        .record_denied(Action::ModifyInstanceAttribute, "i-1", Tagging::LegacyOnly)
        .to_string();
    assert!(
        text.contains("only the legacy KubernetesCluster tag"),
        "{text}"
    );
    assert!(text.contains("--legacy-cluster-tag"), "{text}");
    let text = p
        .record_denied(
            Action::AuthorizeSecurityGroupIngress,
            "sg-1",
            Tagging::Untagged,
        )
        .to_string();
    assert!(text.contains("kubernetes.io/cluster/demo=shared"), "{text}");
    assert!(text.contains("--security-group sg-1"), "{text}");
}

#[tokio::test(start_paused = true)]
async fn verdicts_expire_after_the_ttl() {
    let p = Permissions::new("demo", "us-east-1", Duration::from_secs(60));
    p.record_denied(Action::CreateRoute, "rtb-1", Tagging::Untagged);
    assert!(matches!(
        p.cached(Action::CreateRoute, "rtb-1"),
        Some(Verdict::Denied(_))
    ));
    assert_eq!(p.cached(Action::CreateRoute, "rtb-2"), None);
    assert_eq!(p.cached(Action::CreateTags, "rtb-1"), None, "per action");
    tokio::time::advance(Duration::from_secs(61)).await;
    assert_eq!(
        p.cached(Action::CreateRoute, "rtb-1"),
        None,
        "asked again after the TTL"
    );
}

fn failure(code: &str) -> crate::aws::AwsError {
    crate::aws::AwsError::from_attempt(
        crate::aws::client::operations::Operation::Ec2AuthorizeSecurityGroupIngress,
        crate::aws::client::errors::AttemptFailure::new(
            crate::aws::client::errors::ErrorClass::Fatal,
            Some(code),
            "from AWS",
        ),
        1,
    )
}

#[tokio::test(start_paused = true)]
async fn a_real_calls_refusal_is_recorded_until_the_recheck() {
    let p = Permissions::new("demo", "us-east-1", DEFAULT_TTL);
    let action = Action::AuthorizeSecurityGroupIngress;
    assert_eq!(
        p.record_refusal(
            &failure("InvalidGroup.NotFound"),
            action,
            "sg-1",
            Tagging::Untagged
        ),
        None
    );
    assert_eq!(p.cached(action, "sg-1"), None);
    let denial = p
        .record_refusal(
            &failure("UnauthorizedOperation"),
            action,
            "sg-1",
            Tagging::Untagged,
        )
        .expect("a refusal");
    assert_eq!(
        denial.render_option.as_deref(),
        Some("--security-group sg-1")
    );
    assert_eq!(
        p.cached(action, "sg-1"),
        Some(Verdict::Denied(Box::new(denial)))
    );
    tokio::time::advance(DEFAULT_TTL).await;
    assert_eq!(p.cached(action, "sg-1"), None, "re-checked after the TTL");

    // ELB spells it AccessDenied; a listener is known by its ARN.
    let arn = "arn:aws:elasticloadbalancing:us-east-1:1:listener/net/a/b/c";
    let denial = p
        .record_refusal(
            &failure("AccessDenied"),
            Action::ModifyListener,
            arn,
            Tagging::Current,
        )
        .expect("a refusal");
    assert_eq!(denial.resource_arn, arn);
    assert_eq!(denial.missing_tag, "kubernetes.io/cluster/demo=owned");
    assert!(denial.to_string().contains(&format!(
        "aws elbv2 add-tags --resource-arns {arn} --tags Key=kubernetes.io/cluster/demo,Value=owned"
    )));
}
