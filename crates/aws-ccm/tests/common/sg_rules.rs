//! A security group's inbound rules as AWS lists them
//! (`DescribeSecurityGroupRules`), for counting them. Shared by the `ccm`
//! test binary and the scale bench.

use aws_sdk_ec2::types::Filter;

/// One inbound rule of a group, as `DescribeSecurityGroupRules` has it:
/// (source CIDR or group, description).
pub type InboundRule = (String, String);

/// The inbound rules of `group`, from `DescribeSecurityGroupRules`.
pub async fn inbound_rules(
    ec2: &aws_sdk_ec2::Client,
    group: &str,
) -> anyhow::Result<Vec<InboundRule>> {
    let filter = Filter::builder().name("group-id").values(group).build();
    let mut out = Vec::new();
    let mut token = None;
    loop {
        let page = ec2
            .describe_security_group_rules()
            .filters(filter.clone())
            .set_next_token(token)
            .send()
            .await?;
        for r in page.security_group_rules() {
            if r.is_egress() == Some(true) {
                continue;
            }
            let source = (r.cidr_ipv4())
                .or(r.referenced_group_info().and_then(|g| g.group_id()))
                .unwrap_or_default();
            let desc = r.description().unwrap_or_default();
            out.push((source.to_string(), desc.to_string()));
        }
        token = page.next_token().map(str::to_string);
        if token.is_none() {
            return Ok(out);
        }
    }
}
