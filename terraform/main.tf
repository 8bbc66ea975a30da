# Shared lookups and names. Resources live in s3.tf, iam.tf, network.tf, compute.tf
# and monitoring.tf.

data "aws_partition" "current" {}
data "aws_region" "current" {}
data "aws_caller_identity" "current" {}

# The subnet fixes the availability zone (for the hot volume) and the VPC (for the
# security group).
data "aws_subnet" "node" {
  id = var.subnet_id
}

locals {
  partition  = data.aws_partition.current.partition
  region     = data.aws_region.current.name
  account_id = data.aws_caller_identity.current.account_id

  # Every resource carries this tag; the IAM policy uses it to let the instance
  # attach the hot volume only to instances of this node.
  node_tag_key = "TieredNode"
  tags         = merge(var.tags, { (local.node_tag_key) = var.name })

  # The hot volume's mount point; tiered's data dir is a directory inside it (so
  # the file system's lost+found stays out of the data dir).
  mount_point = "/var/lib/tiered"
  data_dir    = "${local.mount_point}/data"

  # The admin token: the parameter's name only ever reaches the instance; the
  # instance reads the value at boot into a root-only tmpfs file.
  create_admin_token         = var.admin_token_parameter_name == ""
  admin_token_parameter_name = local.create_admin_token ? "/${var.name}/admin-token" : var.admin_token_parameter_name
  admin_token_parameter_arn  = "arn:${local.partition}:ssm:${local.region}:${local.account_id}:parameter/${trimprefix(local.admin_token_parameter_name, "/")}"
  # Written by tiered-secrets.service (root, 0600) ...
  admin_token_host_file = "/run/tiered/admin-token"
  # ... and handed to tiered.service with systemd LoadCredential=, which exposes it to
  # the unprivileged service user at this path (systemd's credentials directory).
  admin_token_credential_file = "/run/credentials/tiered.service/admin-token"
}
