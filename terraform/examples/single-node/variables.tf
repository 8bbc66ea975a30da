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
  description = "Name of the tiered node (prefix of every resource name)."
  default     = "tiered"
}

variable "subnet_id" {
  type        = string
  description = "Private subnet for the node (with a NAT gateway or VPC endpoints for S3, SSM, CloudWatch, KMS and EC2)."
}

variable "s3_prefix" {
  type        = string
  description = "Key prefix of this node's cold objects in the bucket."
  default     = "tiered"
}

variable "allowed_cidrs" {
  type        = list(string)
  description = "CIDRs allowed to reach the service port."
  default     = []
}

variable "allowed_security_group_ids" {
  type        = list(string)
  description = "Security groups (e.g. a load balancer's) allowed to reach the service port."
  default     = []
}

variable "wheelhouse_dir" {
  type        = string
  description = "The wheelhouse deploy/build-artifact.sh wrote (dist/wheelhouse-x86_64): uploaded to the bucket, installed offline by the node."
}

variable "hot_volume_size_gib" {
  type        = number
  description = "Size of the hot EBS volume."
  default     = 100
}

variable "noncurrent_version_expiration_days" {
  type        = number
  description = "Days before deleted cold objects are physically removed from the bucket."
  default     = 7
}

variable "tags" {
  type        = map(string)
  description = "Extra tags for every resource."
  default     = {}
}
