output "bucket_name" {
  description = "The cold-tier bucket."
  value       = module.tiered.bucket_name
}

output "admin_token_parameter_name" {
  description = "SSM parameter holding the admin token."
  value       = module.tiered.admin_token_parameter_name
}

output "hot_volume_id" {
  description = "The hot EBS volume."
  value       = module.tiered.hot_volume_id
}

output "service_url_hints" {
  description = "How to reach the node."
  value       = module.tiered.service_url_hints
}

output "tiered_toml" {
  description = "The rendered tiered configuration."
  value       = module.tiered.tiered_toml
}
