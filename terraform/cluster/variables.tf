variable "name" {
  type        = string
  description = "Name of this tiered cluster; prefixes every resource name (bucket prefix, IAM role, ASG, load balancer, alarms, log groups)."
  default     = "tiered"

  validation {
    # 20 characters leave room for the suffixes of the load balancer (32 max), target group, bucket_prefix and IAM role names.
    condition     = can(regex("^[a-z][a-z0-9-]{1,18}[a-z0-9]$", var.name))
    error_message = "name must be 3-20 characters of a-z, 0-9 and '-', start with a letter and not end with '-'."
  }
}

variable "tags" {
  type        = map(string)
  description = "Tags added to every resource the module creates (on top of the provider's default_tags)."
  default     = {}
}

variable "allowed_cidrs" {
  type        = list(string)
  description = "IPv4 CIDRs allowed to reach the load balancer's listener (clients, a VPN range). Never 0.0.0.0/0."
  default     = []

  validation {
    condition     = alltrue([for c in var.allowed_cidrs : can(cidrhost(c, 0)) && !startswith(c, "0.0.0.0/")])
    error_message = "allowed_cidrs must be IPv4 CIDRs and must not include 0.0.0.0/0 (or any 0.0.0.0/n)."
  }
}

variable "allowed_security_group_ids" {
  type        = list(string)
  description = "Security groups (e.g. your application's) allowed to reach the load balancer's listener."
  default     = []

  validation {
    condition     = alltrue([for s in var.allowed_security_group_ids : can(regex("^sg-[0-9a-f]{8,17}$", s))])
    error_message = "allowed_security_group_ids must be security group ids (sg-...)."
  }
}

variable "egress_https_cidrs" {
  type        = list(string)
  description = "Destinations the instance may reach on TCP 443 besides S3 (which is always allowed through its AWS prefix list): SSM, CloudWatch, KMS and EC2 APIs, and the Amazon Linux package repository at boot (tiered itself comes from the bucket). The default 0.0.0.0/0 is needed unless the VPC has interface endpoints for all of those and an S3 gateway endpoint (the Amazon Linux repositories are served from S3); see README.md."
  default     = ["0.0.0.0/0"]

  validation {
    condition     = alltrue([for c in var.egress_https_cidrs : can(cidrhost(c, 0))])
    error_message = "egress_https_cidrs must be IPv4 CIDRs."
  }
}

variable "instance_type" {
  type        = string
  description = "EC2 instance type. Must match architecture (e.g. m6i.large for x86_64, m7g.large for arm64) and be EBS-optimized (every current generation is)."
  default     = "m6i.large"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]*\\.[a-z0-9]+$", var.instance_type))
    error_message = "instance_type must look like m6i.large."
  }
}

variable "architecture" {
  type        = string
  description = "CPU architecture of instance_type; selects the Amazon Linux 2023 AMI when ami_id is empty."
  default     = "x86_64"

  validation {
    condition     = contains(["x86_64", "arm64"], var.architecture)
    error_message = "architecture must be x86_64 or arm64."
  }
}

variable "ami_id" {
  type        = string
  description = "AMI to run; empty for the latest Amazon Linux 2023 (the user data expects dnf, systemd >= 250, awscli v2 and the SSM agent, as on AL2023). Pin it in production so an AMI release does not replace the instance on the next apply."
  default     = ""

  validation {
    condition     = var.ami_id == "" || can(regex("^ami-[0-9a-f]{8,17}$", var.ami_id))
    error_message = "ami_id must be empty or look like ami-0123456789abcdef0."
  }
}

variable "ebs_kms_key_arn" {
  type        = string
  description = "Customer-managed KMS key for the nodes' root volumes; empty for the AWS-managed aws/ebs key. The key policy must let the AWSServiceRoleForAutoScaling service-linked role use it - see README.md."
  default     = ""

  validation {
    condition     = var.ebs_kms_key_arn == "" || can(regex("^arn:aws[a-z-]*:kms:", var.ebs_kms_key_arn))
    error_message = "ebs_kms_key_arn must be empty or a KMS key ARN."
  }
}

variable "wheelhouse_dir" {
  type        = string
  description = "The release artifact the nodes install: a directory written by `deploy/build-artifact.sh --arch <x86_64|aarch64>` (dist/wheelhouse-<arch>: tiered's wheel, every locked runtime dependency, requirements.txt with hashes, SHA256SUMS). Terraform uploads it to the bucket; nodes install from there offline with --require-hashes. No package index is used, so no default."

  validation {
    condition     = fileexists("${var.wheelhouse_dir}/wheelhouse.json") && fileexists("${var.wheelhouse_dir}/SHA256SUMS") && fileexists("${var.wheelhouse_dir}/requirements.txt")
    error_message = "wheelhouse_dir must be a directory written by deploy/build-artifact.sh (with wheelhouse.json, SHA256SUMS and requirements.txt)."
  }
}

variable "artifact_prefix" {
  type        = string
  description = "Key prefix in the bucket under which the wheelhouse is uploaded (one sub-prefix per artifact digest). Must not overlap s3_prefix: the nodes may only read it."
  default     = "artifacts"

  validation {
    condition     = can(regex("^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*$", var.artifact_prefix))
    error_message = "artifact_prefix must be '/'-separated segments of A-Z, a-z, 0-9, '.', '_' and '-', with no leading or trailing '/'."
  }
}

variable "port" {
  type        = number
  description = "TCP port tiered listens on (all interfaces: reachable only as the security group allows)."
  default     = 4437

  validation {
    condition     = var.port >= 1024 && var.port <= 65535
    error_message = "port must be between 1024 and 65535."
  }
}

variable "s3_prefix" {
  type        = string
  description = "Key prefix for this node's cold objects in the bucket (no leading or trailing '/'). The instance role may touch only keys under it. One tiered data dir per prefix."
  default     = "tiered"

  validation {
    condition     = can(regex("^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*$", var.s3_prefix)) && length(var.s3_prefix) <= 200
    error_message = "s3_prefix must be '/'-separated segments of A-Z, a-z, 0-9, '.', '_' and '-', with no leading or trailing '/'."
  }
}

variable "log_level" {
  type        = string
  description = "tiered's log level."
  default     = "info"

  validation {
    condition     = contains(["debug", "info", "warning", "error"], var.log_level)
    error_message = "log_level must be debug, info, warning or error."
  }
}

variable "auth" {
  type        = string
  description = "Who may use tiered's data plane: 'tokens' (bearer tokens per bucket, issued with the admin token through /v1/admin/tokens) or 'none' (anyone the security group lets in). tiered refuses to listen on 0.0.0.0 without a choice."
  default     = "tokens"

  validation {
    condition     = contains(["tokens", "none"], var.auth)
    error_message = "auth must be tokens or none."
  }
}

variable "public_url" {
  type        = string
  description = "Base URL clients reach tiered at (a load balancer's), used for subscription callback and JWKS URLs; empty: taken from each request."
  default     = ""

  validation {
    condition     = var.public_url == "" || can(regex("^https?://[^\\s\"'\\\\]+$", var.public_url))
    error_message = "public_url must be empty or an http(s) URL without quotes or whitespace."
  }
}

variable "bucket_name" {
  type        = string
  description = "Name of the cold-tier bucket; empty for a generated '<name>-cold-<random>' name."
  default     = ""

  validation {
    condition     = var.bucket_name == "" || can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.bucket_name))
    error_message = "bucket_name must be empty or a valid S3 bucket name."
  }
}

variable "s3_kms_key_arn" {
  type        = string
  description = "Customer-managed KMS key for the bucket's default encryption (SSE-KMS, with an S3 bucket key); empty for SSE-S3. With a key, the instance role gets kms:GenerateDataKey and kms:Decrypt on it."
  default     = ""

  validation {
    condition     = var.s3_kms_key_arn == "" || can(regex("^arn:aws[a-z-]*:kms:", var.s3_kms_key_arn))
    error_message = "s3_kms_key_arn must be empty or a KMS key ARN."
  }
}

variable "noncurrent_version_expiration_days" {
  type        = number
  description = "Days a deleted or overwritten object version is kept before S3 expires it. Data tiered's GC deletes (and erased buckets) physically disappear only after this; it is also the window to recover from an accidental delete."
  default     = 7

  validation {
    condition     = var.noncurrent_version_expiration_days >= 1 && var.noncurrent_version_expiration_days <= 3650
    error_message = "noncurrent_version_expiration_days must be between 1 and 3650."
  }
}

variable "abort_incomplete_multipart_upload_days" {
  type        = number
  description = "Days after which S3 aborts multipart uploads a crash left incomplete (their parts are billed until then)."
  default     = 1

  validation {
    condition     = var.abort_incomplete_multipart_upload_days >= 1 && var.abort_incomplete_multipart_upload_days <= 365
    error_message = "abort_incomplete_multipart_upload_days must be between 1 and 365."
  }
}

variable "admin_token_parameter_name" {
  type        = string
  description = "Name of an existing SSM SecureString parameter holding the admin token; empty: the module creates '/<name>/admin-token' from a random password."
  default     = ""

  validation {
    condition     = var.admin_token_parameter_name == "" || can(regex("^/?[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$", var.admin_token_parameter_name))
    error_message = "admin_token_parameter_name must be empty or a valid SSM parameter name."
  }
}

variable "admin_token_version" {
  type        = number
  description = "Version of the generated admin token (when the module creates the parameter): raise it to store a new random token. The value is written write-only (Terraform >= 1.11): it is never in the plan or the state."
  default     = 1

  validation {
    condition     = var.admin_token_version >= 1 && floor(var.admin_token_version) == var.admin_token_version
    error_message = "admin_token_version must be a whole number >= 1."
  }
}

variable "admin_token_kms_key_arn" {
  type        = string
  description = "Customer-managed KMS key of the admin-token SecureString (created or referenced); empty for the AWS-managed aws/ssm key. With a key, the instance role gets kms:Decrypt on it (via SSM only)."
  default     = ""

  validation {
    condition     = var.admin_token_kms_key_arn == "" || can(regex("^arn:aws[a-z-]*:kms:", var.admin_token_kms_key_arn))
    error_message = "admin_token_kms_key_arn must be empty or a KMS key ARN."
  }
}

variable "iam_permissions_boundary_arn" {
  type        = string
  description = "Permissions boundary to set on the instance role, where the organisation requires one; empty for none."
  default     = ""

  validation {
    condition     = var.iam_permissions_boundary_arn == "" || can(regex("^arn:aws[a-z-]*:iam::", var.iam_permissions_boundary_arn))
    error_message = "iam_permissions_boundary_arn must be empty or an IAM policy ARN."
  }
}

variable "metrics_namespace" {
  type        = string
  description = "CloudWatch namespace for the node's metrics (disk use from the CloudWatch agent and tiered's Prometheus metrics)."
  default     = "Tiered"

  validation {
    condition     = can(regex("^[A-Za-z0-9/_.#:-]{1,255}$", var.metrics_namespace)) && !startswith(var.metrics_namespace, "AWS/")
    error_message = "metrics_namespace must be 1-255 characters of A-Z, a-z, 0-9, /_.#:- and must not start with AWS/."
  }
}

variable "alarm_sns_topic_arn" {
  type        = string
  description = "Existing SNS topic for alarm notifications; empty: the module creates one (subscribe to it yourself)."
  default     = ""

  validation {
    condition     = var.alarm_sns_topic_arn == "" || can(regex("^arn:aws[a-z-]*:sns:", var.alarm_sns_topic_arn))
    error_message = "alarm_sns_topic_arn must be empty or an SNS topic ARN."
  }
}

variable "alarm_sns_kms_key_arn" {
  type        = string
  description = "Customer-managed KMS key to encrypt the module's SNS topic with (its key policy must allow cloudwatch.amazonaws.com kms:Decrypt and kms:GenerateDataKey*); empty: unencrypted, because CloudWatch cannot publish to a topic under the AWS-managed aws/sns key."
  default     = ""

  validation {
    condition     = var.alarm_sns_kms_key_arn == "" || can(regex("^arn:aws[a-z-]*:kms:", var.alarm_sns_kms_key_arn))
    error_message = "alarm_sns_kms_key_arn must be empty or a KMS key ARN."
  }
}

variable "log_retention_days" {
  type        = number
  description = "Retention of the CloudWatch log group holding the scraped Prometheus metrics (embedded metric format)."
  default     = 30

  validation {
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.log_retention_days)
    error_message = "log_retention_days must be a retention CloudWatch Logs accepts (1, 3, 5, 7, 14, 30, 60, 90, ...)."
  }
}

variable "disk_used_alarm_percent" {
  type        = number
  description = "Alarm when the hot volume's file system is fuller than this (percent)."
  default     = 80

  validation {
    condition     = var.disk_used_alarm_percent > 0 && var.disk_used_alarm_percent < 100
    error_message = "disk_used_alarm_percent must be between 0 and 100."
  }
}

variable "append_5xx_alarm_percent" {
  type        = number
  description = "Alarm when more than this percentage of appends answer 5xx over 5 minutes."
  default     = 1

  validation {
    condition     = var.append_5xx_alarm_percent > 0 && var.append_5xx_alarm_percent <= 100
    error_message = "append_5xx_alarm_percent must be in (0, 100]."
  }
}

# ---------------------------------------------------------------- the cluster

variable "subnet_ids" {
  type        = list(string)
  description = "Private subnets, one per availability zone, for the nodes and the (internal) load balancer. At least two zones; three for a cluster that rides out a zone outage with capacity to spare."

  validation {
    condition     = length(var.subnet_ids) >= 2 && alltrue([for s in var.subnet_ids : can(regex("^subnet-[0-9a-f]{8,17}$", s))])
    error_message = "subnet_ids must be at least two subnet ids (subnet-...), in different availability zones."
  }
}

variable "node_count" {
  type        = number
  description = "Nodes in the Auto Scaling group, spread across the subnets' zones. Every node serves a share of the shards; with object-store durability a lost node loses no acknowledged write and its shards move to the others."
  default     = 3

  validation {
    condition     = var.node_count >= 2 && var.node_count <= 64 && floor(var.node_count) == var.node_count
    error_message = "node_count must be a whole number from 2 to 64."
  }
}

variable "shards" {
  type        = number
  description = "Shard count, fixed when the cluster is first created (cluster_shards; nodes configured otherwise refuse to start). A few per node at the largest size you expect."
  default     = 64

  validation {
    condition     = var.shards >= 1 && var.shards <= 4096 && floor(var.shards) == var.shards
    error_message = "shards must be a whole number from 1 to 4096."
  }
}

variable "lease_ttl_s" {
  type        = number
  description = "Shard lease TTL (cluster_lease_ttl_s): how long a dead node's shards wait before another node takes them over."
  default     = 10

  validation {
    condition     = var.lease_ttl_s >= 2 && var.lease_ttl_s <= 120
    error_message = "lease_ttl_s must be between 2 and 120."
  }
}

variable "root_volume_size_gib" {
  type        = number
  description = "Size of each node's encrypted gp3 root volume. It holds the OS, the venv and tiered's data dir, which with object-store durability is a cache (every acknowledged write is in S3)."
  default     = 50

  validation {
    condition     = var.root_volume_size_gib >= 16 && var.root_volume_size_gib <= 16384
    error_message = "root_volume_size_gib must be between 16 and 16384."
  }
}

variable "max_hot_bytes" {
  type        = number
  description = "Cap per node on bytes held only in the hot tier (appends beyond it get 503 with Retry-After). Keep it well below the root volume."
  default     = 8589934592

  validation {
    condition     = var.max_hot_bytes >= 1048576
    error_message = "max_hot_bytes must be at least 1 MiB."
  }
}

variable "load_balancer_internal" {
  type        = bool
  description = "An internal load balancer (reachable from the VPC and what is peered or routed to it). false puts it on public subnets you must pass in subnet_ids; tiered's auth (tokens) then guards every request."
  default     = true
}

variable "listener_port" {
  type        = number
  description = "Port of the load balancer's listener."
  default     = 443

  validation {
    condition     = var.listener_port >= 1 && var.listener_port <= 65535
    error_message = "listener_port must be a TCP port."
  }
}

variable "certificate_arn" {
  type        = string
  description = "ACM certificate for a TLS listener (recommended: tokens travel in headers); empty: a plain TCP listener."
  default     = ""

  validation {
    condition     = var.certificate_arn == "" || can(regex("^arn:aws[a-z-]*:acm:", var.certificate_arn))
    error_message = "certificate_arn must be empty or an ACM certificate ARN."
  }
}

variable "cluster_secret_version" {
  type        = number
  description = "Version of the generated cluster secret (node-to-node signatures): raise it to store a new one, then replace every node (an instance refresh) - nodes with different secrets refuse each other's calls."
  default     = 1

  validation {
    condition     = var.cluster_secret_version >= 1 && floor(var.cluster_secret_version) == var.cluster_secret_version
    error_message = "cluster_secret_version must be a whole number >= 1."
  }
}

variable "fsync" {
  type        = string
  description = "tiered's fsync mode. 'interval' by default: with object-store durability an append is acknowledged once it is in S3, and the local disk is a cache."
  default     = "interval"

  validation {
    condition     = contains(["always", "interval"], var.fsync)
    error_message = "fsync must be 'always' or 'interval'."
  }
}

variable "takeover_alarm_threshold" {
  type        = number
  description = "Alarm when more than this many shards were taken over (from a node that died or stopped renewing) in 5 minutes. 0: any takeover notifies."
  default     = 0

  validation {
    condition     = var.takeover_alarm_threshold >= 0
    error_message = "takeover_alarm_threshold must not be negative."
  }
}
