output "bucket_name" {
  description = "The cold-tier bucket."
  value       = aws_s3_bucket.cold.bucket
}

output "bucket_arn" {
  description = "ARN of the cold-tier bucket."
  value       = aws_s3_bucket.cold.arn
}

output "s3_prefix" {
  description = "The key prefix this node's cold objects live under."
  value       = var.s3_prefix
}

output "instance_role_arn" {
  description = "ARN of the instance role (e.g. to allow it in a KMS key policy)."
  value       = aws_iam_role.instance.arn
}

output "instance_role_name" {
  description = "Name of the instance role."
  value       = aws_iam_role.instance.name
}

output "security_group_id" {
  description = "The node's security group (allow it as a source in a load balancer's or a database's group)."
  value       = aws_security_group.node.id
}

output "hot_volume_id" {
  description = "The hot EBS volume (hot segments, journal, snapshots). Snapshot it for backups."
  value       = aws_ebs_volume.hot.id
}

output "autoscaling_group_name" {
  description = "The one-instance Auto Scaling group."
  value       = aws_autoscaling_group.node.name
}

output "admin_token_parameter_name" {
  description = "SSM parameter holding the admin token (read it with `aws ssm get-parameter --with-decryption --name ...`)."
  value       = local.admin_token_parameter_name
}

output "service_port" {
  description = "TCP port tiered listens on."
  value       = var.port
}

output "service_url_hints" {
  description = "How to reach the node: its private IP changes when the instance is replaced, so use a load balancer (target_group_arns) for a stable URL."
  value = {
    private_url       = "http://<instance private IP>:${var.port}   (aws ec2 describe-instances --filters Name=tag:aws:autoscaling:groupName,Values=${aws_autoscaling_group.node.name} Name=instance-state-name,Values=running --query 'Reservations[].Instances[].PrivateIpAddress')"
    port_forward      = "aws ssm start-session --target <instance id> --document-name AWS-StartPortForwardingSession --parameters portNumber=${var.port},localPortNumber=${var.port}   (then http://127.0.0.1:${var.port})"
    shell             = "aws ssm start-session --target <instance id>"
    health_check      = "GET /readyz (readiness, for a load balancer) and GET /healthz (liveness)"
    metrics_namespace = var.metrics_namespace
  }
}

output "alarm_topic_arn" {
  description = "SNS topic the alarms notify (subscribe to it)."
  value       = local.alarm_topic_arn
}

output "tiered_toml" {
  description = "The rendered /etc/tiered/tiered.toml."
  value       = local.tiered_toml
}
