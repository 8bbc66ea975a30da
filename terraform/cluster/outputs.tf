output "url" {
  description = "The cluster's URL (the load balancer; any node answers any request)."
  value       = "${var.certificate_arn != "" ? "https" : "http"}://${aws_lb.cluster.dns_name}${contains([80, 443], var.listener_port) ? "" : ":${var.listener_port}"}"
}

output "load_balancer_dns_name" {
  description = "DNS name of the network load balancer (point your own DNS name at it, matching certificate_arn)."
  value       = aws_lb.cluster.dns_name
}

output "bucket_name" {
  description = "The bucket the cluster shares (cold tier, WAL, cluster objects, release artifact)."
  value       = aws_s3_bucket.cold.bucket
}

output "s3_prefix" {
  description = "The key prefix of the cluster's objects."
  value       = var.s3_prefix
}

output "node_role_arn" {
  description = "ARN of the nodes' role (e.g. to allow it in a KMS key policy)."
  value       = aws_iam_role.instance.arn
}

output "node_security_group_id" {
  description = "The nodes' security group."
  value       = aws_security_group.node.id
}

output "load_balancer_security_group_id" {
  description = "The load balancer's security group."
  value       = aws_security_group.lb.id
}

output "autoscaling_group_name" {
  description = "The nodes' Auto Scaling group."
  value       = aws_autoscaling_group.nodes.name
}

output "admin_token_parameter_name" {
  description = "SSM parameter holding the admin token (`aws ssm get-parameter --with-decryption --name ...`)."
  value       = local.admin_token_parameter_name
}

output "cluster_secret_parameter_name" {
  description = "SSM parameter holding the cluster secret (read by the nodes only)."
  value       = local.cluster_secret_parameter_name
}

output "alarm_topic_arn" {
  description = "SNS topic the alarms notify (subscribe to it)."
  value       = local.alarm_topic_arn
}

output "artifact" {
  description = "The release artifact the nodes install: version, architecture and where it is in the bucket."
  value = {
    tiered_version = local.wheelhouse_manifest.tiered_version
    architecture   = local.wheelhouse_manifest.architecture
    location       = "s3://${aws_s3_bucket.cold.bucket}/${local.artifact_key_prefix}/"
    sha256sums     = local.wheelhouse_sums_sha256
  }
}

output "tiered_toml" {
  description = "The rendered /etc/tiered/tiered.toml of every node (the node id and URL come from /etc/tiered/node.env)."
  value       = local.tiered_toml
}
