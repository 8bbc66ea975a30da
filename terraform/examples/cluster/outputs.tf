output "url" {
  description = "The cluster's URL."
  value       = module.tiered.url
}

output "admin_token_parameter_name" {
  description = "SSM parameter holding the admin token."
  value       = module.tiered.admin_token_parameter_name
}

output "bucket_name" {
  description = "The cluster's bucket."
  value       = module.tiered.bucket_name
}

output "alarm_topic_arn" {
  description = "SNS topic of the alarms."
  value       = module.tiered.alarm_topic_arn
}

output "autoscaling_group_name" {
  description = "The nodes' Auto Scaling group."
  value       = module.tiered.autoscaling_group_name
}
