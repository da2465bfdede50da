"""Seeds moto with a small simulated cluster for `make sandbox`.

Creates a VPC with a cluster-tagged public subnet and route table, an
internet gateway, and three EC2 instances; then writes the Kubernetes objects
kubelets would have registered (three tainted Nodes named like kubeadm nodes,
after the instances' private DNS names) and one `type: LoadBalancer` Service.

Usage: sandbox_seed.py ENDPOINT CLUSTER_ID OUT_YAML
"""

import sys

import boto3

endpoint, cluster_id, out_path = sys.argv[1], sys.argv[2], sys.argv[3]
cluster_tag = {"Key": f"kubernetes.io/cluster/{cluster_id}", "Value": "owned"}
ec2 = boto3.client(
    "ec2",
    endpoint_url=endpoint,
    region_name="us-east-1",
    aws_access_key_id="testing",
    aws_secret_access_key="testing",
)

vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
ec2.create_tags(Resources=[vpc], Tags=[cluster_tag, {"Key": "Name", "Value": "sandbox"}])
subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24", AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]
ec2.create_tags(Resources=[subnet], Tags=[cluster_tag, {"Key": "kubernetes.io/role/elb", "Value": "1"}])
igw = ec2.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
ec2.attach_internet_gateway(InternetGatewayId=igw, VpcId=vpc)
rtb = ec2.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"]
ec2.create_tags(Resources=[rtb], Tags=[cluster_tag])
ec2.create_route(RouteTableId=rtb, DestinationCidrBlock="0.0.0.0/0", GatewayId=igw)
ec2.associate_route_table(RouteTableId=rtb, SubnetId=subnet)
sg = ec2.create_security_group(GroupName="sandbox-nodes", Description="sandbox nodes", VpcId=vpc)["GroupId"]
ec2.create_tags(Resources=[sg], Tags=[cluster_tag])

reservation = ec2.run_instances(
    ImageId="ami-12c6146b",
    InstanceType="t3.medium",
    MinCount=3,
    MaxCount=3,
    SubnetId=subnet,
    SecurityGroupIds=[sg],
    TagSpecifications=[{"ResourceType": "instance", "Tags": [cluster_tag]}],
)
instances = reservation["Instances"]

docs = []
for i, inst in enumerate(instances):
    name = inst["PrivateDnsName"]
    print(f"instance {inst['InstanceId']} {inst['PrivateIpAddress']} -> node {name}", file=sys.stderr)
    docs.append(f"""apiVersion: v1
kind: Node
metadata:
  name: {name}
  labels:
    kubernetes.io/hostname: {name}
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
spec:
  podCIDR: 10.244.{i}.0/24
  podCIDRs: ["10.244.{i}.0/24"]
  taints:
  - key: node.cloudprovider.kubernetes.io/uninitialized
    value: "true"
    effect: NoSchedule
status:
  conditions:
  - type: Ready
    status: "True"
    reason: KubeletReady
    message: kubelet is posting ready status
  nodeInfo:
    kubeletVersion: v1.34.0
""")
docs.append("""apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: default
spec:
  type: LoadBalancer
  selector:
    app: web
  ports:
  - name: http
    port: 80
    targetPort: 8080
    nodePort: 30080
    protocol: TCP
""")
with open(out_path, "w", encoding="utf-8") as f:
    f.write("---\n".join(docs))
print(f"seeded VPC {vpc}, subnet {subnet}, route table {rtb}, {len(instances)} instances", file=sys.stderr)
