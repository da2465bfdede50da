"""Seeds the AWS emulator for the kind e2e (e2e/run.sh), after the kind
cluster is up: a cluster-tagged VPC whose CIDR is the kind Docker network's,
two public subnets (two zones, so a load balancer's subnets can change), a
route table through an internet gateway, a node security group, and one
running instance per kind node whose private IP is that node's container
IP. The kubelet reports the container IP (kind passes it as --node-ip), so
the CCM finds it among the instance's addresses and sets them.

Prints "<node> <zone> <instance-id>" per node, in the order given, for
e2e/run.sh to set each Node's spec.providerID (aws:///<zone>/<instance-id>).

Usage: seed.py ENDPOINT CLUSTER_ID NETWORK_CIDR NODE=IP [NODE=IP...]
"""

import ipaddress
import sys

import boto3


def fail(msg):
    sys.exit(f"seed.py: {msg}")


def main(argv):
    if len(argv) < 4:
        fail(__doc__)
    endpoint, cluster_id, cidr = argv[0], argv[1], argv[2]
    try:
        network = ipaddress.ip_network(cidr)
    except ValueError as e:
        fail(f"NETWORK_CIDR {cidr!r}: {e}")
    if network.version != 4 or not 16 <= network.prefixlen <= 27:
        fail(f"NETWORK_CIDR {cidr}: a VPC takes an IPv4 block from /16 to /28 and this seeds two "
             "subnets in it; give kind's IPv4 Docker network (docker network inspect kind)")
    # The nodes' half and a second zone's half.
    half_a, half_b = network.subnets(prefixlen_diff=1)
    nodes = []
    for arg in argv[3:]:
        name, _, ip = arg.partition("=")
        try:
            addr = ipaddress.ip_address(ip)
        except ValueError:
            fail(f"{arg!r} is not NODE=IP")
        if addr not in half_a:
            fail(f"node {name} has IP {addr}, outside {half_a} (the first half of {network}, where the "
                 "node subnet goes); is the node on this network?")
        nodes.append((name, str(addr)))

    zone_a, zone_b = "us-east-1a", "us-east-1b"
    owned = {"Key": f"kubernetes.io/cluster/{cluster_id}", "Value": "owned"}
    elb_role = {"Key": "kubernetes.io/role/elb", "Value": "1"}
    ec2 = boto3.client("ec2", endpoint_url=endpoint, region_name="us-east-1",
                       aws_access_key_id="testing", aws_secret_access_key="testing")

    vpc = ec2.create_vpc(CidrBlock=str(network))["Vpc"]["VpcId"]
    ec2.create_tags(Resources=[vpc], Tags=[owned, {"Key": "Name", "Value": cluster_id}])
    subnet_a = ec2.create_subnet(VpcId=vpc, CidrBlock=str(half_a), AvailabilityZone=zone_a)["Subnet"]["SubnetId"]
    subnet_b = ec2.create_subnet(VpcId=vpc, CidrBlock=str(half_b), AvailabilityZone=zone_b)["Subnet"]["SubnetId"]
    ec2.create_tags(Resources=[subnet_a, subnet_b], Tags=[owned, elb_role])
    igw = ec2.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
    ec2.attach_internet_gateway(InternetGatewayId=igw, VpcId=vpc)
    rtb = ec2.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"]
    ec2.create_tags(Resources=[rtb], Tags=[owned])
    ec2.create_route(RouteTableId=rtb, DestinationCidrBlock="0.0.0.0/0", GatewayId=igw)
    ec2.associate_route_table(RouteTableId=rtb, SubnetId=subnet_a)
    ec2.associate_route_table(RouteTableId=rtb, SubnetId=subnet_b)
    sg = ec2.create_security_group(GroupName=f"{cluster_id}-nodes", Description="e2e nodes", VpcId=vpc)["GroupId"]
    ec2.create_tags(Resources=[sg], Tags=[owned])

    for name, ip in nodes:
        inst = ec2.run_instances(
            ImageId="ami-12c6146b", InstanceType="t3.medium", MinCount=1, MaxCount=1,
            SubnetId=subnet_a, SecurityGroupIds=[sg], PrivateIpAddress=ip,
            TagSpecifications=[{"ResourceType": "instance",
                                "Tags": [owned, {"Key": "Name", "Value": name}]}],
        )["Instances"][0]
        got = inst.get("PrivateIpAddress")
        if got != ip:
            fail(f"the emulator gave node {name}'s instance {inst['InstanceId']} the IP {got}, not {ip}")
        print(f"{name} {zone_a} {inst['InstanceId']}")
    print(f"seed.py: VPC {vpc} ({network}), subnets {subnet_a} ({half_a}) and {subnet_b} ({half_b}), "
          f"route table {rtb}, group {sg}, {len(nodes)} instance(s)", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
