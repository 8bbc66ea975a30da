# The admin bearer token (GC, retention, erasure, /metrics). Unless an existing
# parameter is named, the module makes one from a random password. Its value is in the
# Terraform state (sensitive): keep the state in an encrypted, access-controlled backend.

resource "random_password" "admin_token" {
  count = local.create_admin_token ? 1 : 0

  # 48 alphanumerics (~285 bits): nothing to quote in a header or a shell.
  length  = 48
  special = false
}

resource "aws_ssm_parameter" "admin_token" {
  #checkov:skip=CKV_AWS_337:SecureString under the AWS-managed aws/ssm key by default, which only principals of this account with ssm:GetParameter on this parameter can use; a customer key is one variable away (admin_token_kms_key_arn) and then gets a kms:Decrypt grant via SSM only.
  count = local.create_admin_token ? 1 : 0

  name        = local.admin_token_parameter_name
  description = "Admin bearer token of tiered node ${var.name} (read at boot by the instance role)"
  type        = "SecureString"
  key_id      = var.admin_token_kms_key_arn != "" ? var.admin_token_kms_key_arn : null
  value       = random_password.admin_token[0].result
  tags        = local.tags
}
