# The admin bearer token (GC, retention, erasure, /metrics). Unless an existing
# parameter is named, the module makes one from a random password that Secrets Manager
# generates for this apply only (an ephemeral resource) and writes it write-only: the
# value is never in the plan or the state. Raise admin_token_version to store a new one.

ephemeral "aws_secretsmanager_random_password" "admin_token" {
  count = local.create_admin_token ? 1 : 0

  # 48 alphanumerics (~285 bits): nothing to quote in a header or a shell.
  password_length     = 48
  exclude_punctuation = true
  include_space       = false
}

resource "aws_ssm_parameter" "admin_token" {
  #checkov:skip=CKV_AWS_337:SecureString under the AWS-managed aws/ssm key by default, which only principals of this account with ssm:GetParameter on this parameter can use; a customer key is one variable away (admin_token_kms_key_arn) and then gets a kms:Decrypt grant via SSM only.
  count = local.create_admin_token ? 1 : 0

  name             = local.admin_token_parameter_name
  description      = "Admin bearer token of tiered node ${var.name} (read at boot by the instance role)"
  type             = "SecureString"
  key_id           = var.admin_token_kms_key_arn != "" ? var.admin_token_kms_key_arn : null
  value_wo         = ephemeral.aws_secretsmanager_random_password.admin_token[0].random_password
  value_wo_version = var.admin_token_version
  tags             = local.tags
}
