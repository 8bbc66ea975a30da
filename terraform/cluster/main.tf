# A tiered cluster (docs/cluster.md): node_count nodes in one Auto Scaling group across
# availability zones, sharing one bucket and prefix, with object-store durability (an
# append is acknowledged once it is in S3, so losing a node or a zone loses no
# acknowledged write), behind a load balancer. Resources live in s3.tf, artifact.tf,
# iam.tf, secrets.tf, network.tf, lb.tf, compute.tf and monitoring.tf; the boot files
# are the single-node module's templates (../templates).

data "aws_partition" "current" {}
data "aws_region" "current" {}
data "aws_caller_identity" "current" {}

# The subnets fix the zones and the VPC.
data "aws_subnet" "node" {
  for_each = toset(var.subnet_ids)
  id       = each.value
}

locals {
  partition  = data.aws_partition.current.partition
  region     = data.aws_region.current.name
  account_id = data.aws_caller_identity.current.account_id
  vpc_id     = one(distinct([for s in data.aws_subnet.node : s.vpc_id]))
  zones      = distinct([for s in data.aws_subnet.node : s.availability_zone])
  templates  = "${path.module}/../templates"

  node_tag_key = "TieredCluster"
  tags         = merge(var.tags, { (local.node_tag_key) = var.name })

  # With object-store durability the data dir is a cache on the root volume, created by
  # systemd (StateDirectory=tiered) for the service user.
  data_dir = "/var/lib/tiered"

  # Secrets: the parameters' names only ever reach the instances, which read the values
  # at boot into root-only tmpfs files; systemd hands tiered copies (LoadCredential=).
  create_admin_token             = var.admin_token_parameter_name == ""
  admin_token_parameter_name     = local.create_admin_token ? "/${var.name}/admin-token" : var.admin_token_parameter_name
  admin_token_parameter_arn      = "arn:${local.partition}:ssm:${local.region}:${local.account_id}:parameter/${trimprefix(local.admin_token_parameter_name, "/")}"
  cluster_secret_parameter_name  = "/${var.name}/cluster-secret"
  cluster_secret_parameter_arn   = "arn:${local.partition}:ssm:${local.region}:${local.account_id}:parameter/${trimprefix(local.cluster_secret_parameter_name, "/")}"
  admin_token_host_file          = "/run/tiered/admin-token"
  cluster_secret_host_file       = "/run/tiered/cluster-secret"
  admin_token_credential_file    = "/run/credentials/tiered.service/admin-token"
  cluster_secret_credential_file = "/run/credentials/tiered.service/cluster-secret"
  # Written once per instance by user-data.sh from the instance metadata: this node's
  # id (the instance id) and the URL its peers forward to (its private IP).
  node_env_file = "/etc/tiered/node.env"
}

check "subnets_span_zones" {
  assert {
    condition     = length(local.zones) >= 2
    error_message = "subnet_ids are all in ${join(", ", local.zones)}: give subnets in at least two availability zones."
  }
}
