//! IPv6 for seeded VPCs and subnets, as a dual-stack NLB needs on AWS (the
//! fault proxy refuses one in a subnet without, as ELBv2 does). Shared by
//! the `ccm` and `e2e` test binaries.

/// An Amazon-provided IPv6 /56 for VPC `vpc_id`; the block.
pub async fn give_vpc(ec2: &aws_sdk_ec2::Client, vpc_id: &str) -> anyhow::Result<String> {
    let associated = ec2
        .associate_vpc_cidr_block()
        .vpc_id(vpc_id)
        .amazon_provided_ipv6_cidr_block(true)
        .send()
        .await?;
    (associated.ipv6_cidr_block_association())
        .and_then(|a| a.ipv6_cidr_block())
        .map(str::to_string)
        .ok_or_else(|| anyhow::anyhow!("moto gave VPC {vpc_id} no IPv6 block"))
}

/// The `n`-th /64 of the VPC's `block` to `subnet`.
pub async fn give_subnet(
    ec2: &aws_sdk_ec2::Client,
    subnet: &str,
    block: &str,
    n: u128,
) -> anyhow::Result<()> {
    let (prefix, _) = block
        .split_once('/')
        .ok_or_else(|| anyhow::anyhow!("not an IPv6 block: {block:?}"))?;
    let base: std::net::Ipv6Addr = prefix.parse()?;
    let nth = std::net::Ipv6Addr::from(u128::from(base) + (n << 64));
    ec2.associate_subnet_cidr_block()
        .subnet_id(subnet)
        .ipv6_cidr_block(format!("{nth}/64"))
        .send()
        .await?;
    Ok(())
}
