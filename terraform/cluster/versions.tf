terraform {
  # Write-only attributes (the admin token never reaches the state) need 1.11.
  required_version = ">= 1.11.0, < 2.0.0"

  # Only the AWS provider: the token comes from an ephemeral Secrets Manager random
  # password, the user data is built in HCL (base64gzip), so `terraform validate` runs
  # wherever this one provider is available (terraform/checks.sh).
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.100"
    }
  }
}
