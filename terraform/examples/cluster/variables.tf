variable "region" {
  type        = string
  description = "AWS region to deploy into."

  validation {
    condition     = can(regex("^[a-z]{2}(-[a-z]+)+-[0-9]$", var.region))
    error_message = "region must look like eu-west-1."
  }
}

variable "name" {
  type        = string
  description = "Name of the cluster (prefix of every resource name)."
  default     = "tiered"
}

variable "subnet_ids" {
  type        = list(string)
  description = "Private subnets in different availability zones (with a NAT gateway or VPC endpoints for S3, SSM, CloudWatch and KMS)."
}

variable "node_count" {
  type        = number
  description = "Number of nodes."
  default     = 3
}

variable "s3_prefix" {
  type        = string
  description = "Key prefix of the cluster's objects in the bucket."
  default     = "tiered"
}

variable "allowed_cidrs" {
  type        = list(string)
  description = "CIDRs allowed to reach the load balancer."
  default     = []
}

variable "allowed_security_group_ids" {
  type        = list(string)
  description = "Security groups allowed to reach the load balancer."
  default     = []
}

variable "certificate_arn" {
  type        = string
  description = "ACM certificate for a TLS listener; empty for TCP."
  default     = ""
}

variable "wheelhouse_dir" {
  type        = string
  description = "The wheelhouse deploy/build-artifact.sh wrote (dist/wheelhouse-x86_64): uploaded to the bucket, installed offline by every node."
}

variable "tags" {
  type        = map(string)
  description = "Extra tags for every resource."
  default     = {}
}
