# One tiered node in an existing VPC subnet. Copy this directory, fill in
# terraform.tfvars (from terraform.tfvars.example) and backend.tf (from
# backend.tf.example), then `terraform init && terraform apply`.

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

  tiered_package = var.tiered_package
  tiered_version = var.tiered_version

  hot_volume_size_gib = var.hot_volume_size_gib

  noncurrent_version_expiration_days = var.noncurrent_version_expiration_days

  tags = var.tags
}
