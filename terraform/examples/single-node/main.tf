# One tiered node in an existing VPC subnet. Build the release artifact
# (deploy/build-artifact.sh), copy this directory, fill in terraform.tfvars (from
# terraform.tfvars.example) and backend.tf (from backend.tf.example), then
# `terraform init && terraform apply`. terraform/README.md walks through it.

provider "aws" {
  region = var.region

  default_tags {
    tags = {
      Project   = "tiered"
      ManagedBy = "terraform"
    }
  }
}

module "tiered" {
  source = "../.."

  name      = var.name
  subnet_id = var.subnet_id
  s3_prefix = var.s3_prefix

  allowed_cidrs              = var.allowed_cidrs
  allowed_security_group_ids = var.allowed_security_group_ids

  # The release artifact: `deploy/build-artifact.sh` in the tiered repository writes it.
  wheelhouse_dir = var.wheelhouse_dir

  hot_volume_size_gib = var.hot_volume_size_gib

  noncurrent_version_expiration_days = var.noncurrent_version_expiration_days

  tags = var.tags
}
