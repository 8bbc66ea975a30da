# A tiered cluster of three nodes across availability zones in an existing VPC. Build the
# release artifact (deploy/build-artifact.sh), copy this directory, fill in
# terraform.tfvars (from terraform.tfvars.example) and backend.tf (from
# backend.tf.example), then `terraform init && terraform apply`. terraform/README.md
# walks through it, up to the first append.

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
  source = "../../cluster"

  name       = var.name
  subnet_ids = var.subnet_ids
  node_count = var.node_count
  s3_prefix  = var.s3_prefix

  allowed_cidrs              = var.allowed_cidrs
  allowed_security_group_ids = var.allowed_security_group_ids
  certificate_arn            = var.certificate_arn

  # The release artifact: `deploy/build-artifact.sh` in the tiered repository writes it.
  wheelhouse_dir = var.wheelhouse_dir

  tags = var.tags
}
