"""Seeds the AWS emulator for the kind e2e: a cluster-tagged VPC, public
subnet, route table and node security group, and one running instance per
kind node. Prints "<zone> <instance-id>" per instance, in node order, for
e2e/run.sh to hand to the kubelets as --provider-id.

Usage: seed.py ENDPOINT CLUSTER_ID NODE_COUNT
"""

import sys

import boto3

endpoint, cluster_id, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
zone = "us-east-1a"
owned = {"Key": f"kubernetes.io/cluster/{cluster_id}", "Value": "owned"}
ec2 = boto3.client(
    "ec2",
    endpoint_url=endpoint,
    region_name="us-east-1",
    aws_access_key_id="testing",
    aws_secret_access_key="testing",
)

vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
ec2.create_tags(Resources=[vpc], Tags=[owned, {"Key": "Name", "Value": cluster_id}])
subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24", AvailabilityZone=zone)["Subnet"]["SubnetId"]
ec2.create_tags(Resources=[subnet], Tags=[owned, {"Key": "kubernetes.io/role/elb", "Value": "1"}])
igw = ec2.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
ec2.attach_internet_gateway(InternetGatewayId=igw, VpcId=vpc)
rtb = ec2.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"]
ec2.create_tags(Resources=[rtb], Tags=[owned])
ec2.create_route(RouteTableId=rtb, DestinationCidrBlock="0.0.0.0/0", GatewayId=igw)
ec2.associate_route_table(RouteTableId=rtb, SubnetId=subnet)
# A second public zone, so a load balancer's subnets can change.
subnet_b = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.2.0/24", AvailabilityZone="us-east-1b")["Subnet"]["SubnetId"]
ec2.create_tags(Resources=[subnet_b], Tags=[owned, {"Key": "kubernetes.io/role/elb", "Value": "1"}])
ec2.associate_route_table(RouteTableId=rtb, SubnetId=subnet_b)
sg = ec2.create_security_group(GroupName=f"{cluster_id}-nodes", Description="e2e nodes", VpcId=vpc)["GroupId"]
ec2.create_tags(Resources=[sg], Tags=[owned])

instances = ec2.run_instances(
    ImageId="ami-12c6146b",
    InstanceType="t3.medium",
    MinCount=count,
    MaxCount=count,
    SubnetId=subnet,
    SecurityGroupIds=[sg],
    TagSpecifications=[{"ResourceType": "instance", "Tags": [owned]}],
)["Instances"]
for inst in sorted(instances, key=lambda i: i["AmiLaunchIndex"]):
    print(f"{zone} {inst['InstanceId']}")
print(f"seeded VPC {vpc}, subnet {subnet}, route table {rtb}, group {sg}", file=sys.stderr)
