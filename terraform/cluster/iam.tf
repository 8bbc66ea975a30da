# The nodes' role: least privilege, matched to what the code and the boot scripts do.
# The cold-tier grant is the single-node module's, word for word (tests/deploy/test_iam_policy.py
# checks both against the S3 operations the test suite records): a cluster node makes the
# same calls, under the same prefix (shards/, _tiered/cluster/ and data/ are all in it).

locals {
  # Every S3 API operation tiered's code (cold/objects/s3.py) issues, and the IAM action that
  # authorizes it. tests/deploy/test_iam_policy.py records every operation the test suite's S3
  # paths make and fails if this map, or the policy below, differs from what the code
  # does; the suite's cold-tier, GC and verify tests also run as an IAM user holding only
  # this policy (moto with IAM enforced). The probe object tiered writes at start-up
  # (_tiered/probe-conditional-*) lives under the prefix like everything else.
  tiered_s3_operation_actions = {
    PutObject               = "s3:PutObject" # also with If-None-Match: * (create-only) and If-Match (compare-and-set)
    CreateMultipartUpload   = "s3:PutObject"
    UploadPart              = "s3:PutObject"
    CompleteMultipartUpload = "s3:PutObject"
    GetObject               = "s3:GetObject" # ranged reads
    HeadObject              = "s3:GetObject"
    DeleteObject            = "s3:DeleteObject"
    DeleteObjects           = "s3:DeleteObject"
    AbortMultipartUpload    = "s3:AbortMultipartUpload"
    ListObjectsV2           = "s3:ListBucket"
  }

  # The actions granted on objects under the prefix, and on the bucket (listing).
  # No s3:DeleteObjectVersion: a delete only adds a delete marker, so the role can
  # never destroy data before the noncurrent-version expiry (see README.md).
  tiered_s3_object_actions = ["s3:AbortMultipartUpload", "s3:DeleteObject", "s3:GetObject", "s3:PutObject"]
  tiered_s3_bucket_actions = ["s3:ListBucket"]
}

data "aws_iam_policy_document" "assume_ec2" {
  statement {
    sid     = "Ec2AssumesTheInstanceRole"
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "instance" {
  name                 = "${var.name}-node"
  description          = "tiered cluster ${var.name} nodes: cold tier under s3://${aws_s3_bucket.cold.bucket}/${var.s3_prefix}/, the release artifact, the admin token and cluster secret, Session Manager and CloudWatch."
  assume_role_policy   = data.aws_iam_policy_document.assume_ec2.json
  permissions_boundary = var.iam_permissions_boundary_arn != "" ? var.iam_permissions_boundary_arn : null
  tags                 = local.tags
}

resource "aws_iam_instance_profile" "instance" {
  name = "${var.name}-node"
  role = aws_iam_role.instance.name
  tags = local.tags
}

# ---------------------------------------------------------------- the cold tier

data "aws_iam_policy_document" "tiered_s3" {
  statement {
    sid       = "ObjectsUnderPrefix"
    effect    = "Allow"
    actions   = local.tiered_s3_object_actions
    resources = ["${aws_s3_bucket.cold.arn}/${var.s3_prefix}/*"]
  }

  statement {
    sid       = "ListPrefix"
    effect    = "Allow"
    actions   = local.tiered_s3_bucket_actions
    resources = [aws_s3_bucket.cold.arn]

    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["${var.s3_prefix}/", "${var.s3_prefix}/*"]
    }
  }

  # SSE-KMS: S3 asks KMS for a data key on every PUT (and upload part) and to
  # decrypt it on every GET, on the caller's behalf.
  dynamic "statement" {
    for_each = var.s3_kms_key_arn != "" ? [var.s3_kms_key_arn] : []

    content {
      sid       = "ColdTierKmsViaS3"
      effect    = "Allow"
      actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
      resources = [statement.value]

      condition {
        test     = "StringEquals"
        variable = "kms:ViaService"
        values   = ["s3.${local.region}.amazonaws.com"]
      }
    }
  }
}

resource "aws_iam_role_policy" "tiered_s3" {
  name   = "tiered-cold-tier"
  role   = aws_iam_role.instance.id
  policy = data.aws_iam_policy_document.tiered_s3.json

  lifecycle {
    precondition {
      condition     = toset(values(local.tiered_s3_operation_actions)) == toset(concat(local.tiered_s3_object_actions, local.tiered_s3_bucket_actions))
      error_message = "The granted S3 actions must be exactly those the operations in local.tiered_s3_operation_actions need."
    }
  }
}

# ---------------------------------------------------------------- the node itself

data "aws_iam_policy_document" "node" {
  # Boot: read the admin token and the cluster secret (tiered-secrets.service).
  statement {
    sid       = "ReadTheSecrets"
    effect    = "Allow"
    actions   = ["ssm:GetParameter"]
    resources = [local.admin_token_parameter_arn, local.cluster_secret_parameter_arn]
  }

  dynamic "statement" {
    for_each = var.admin_token_kms_key_arn != "" ? [var.admin_token_kms_key_arn] : []

    content {
      sid       = "SecretsKmsViaSsm"
      effect    = "Allow"
      actions   = ["kms:Decrypt"]
      resources = [statement.value]

      condition {
        test     = "StringEquals"
        variable = "kms:ViaService"
        values   = ["ssm.${local.region}.amazonaws.com"]
      }
    }
  }

  # Boot: fetch the release artifact (user-data.sh) - that one wheelhouse, read-only.
  statement {
    sid       = "ReadTheWheelhouse"
    effect    = "Allow"
    actions   = ["s3:GetObject"]
    resources = ["${aws_s3_bucket.cold.arn}/${local.artifact_key_prefix}/*"]
  }

  statement {
    sid       = "ListTheWheelhouse"
    effect    = "Allow"
    actions   = ["s3:ListBucket"]
    resources = [aws_s3_bucket.cold.arn]

    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["${local.artifact_key_prefix}/", "${local.artifact_key_prefix}/*"]
    }
  }

  # Session Manager instead of SSH (the minimum AWS documents; no
  # AmazonSSMManagedInstanceCore, which grants ssm:GetParameter(s) on every parameter).
  statement {
    sid    = "SessionManagerChannels"
    effect = "Allow"
    actions = [
      "ssmmessages:CreateControlChannel",
      "ssmmessages:CreateDataChannel",
      "ssmmessages:OpenControlChannel",
      "ssmmessages:OpenDataChannel",
    ]
    resources = ["*"]
  }

  statement {
    sid       = "SessionManagerRegistration"
    effect    = "Allow"
    actions   = ["ssm:UpdateInstanceInformation"]
    resources = ["arn:${local.partition}:ec2:${local.region}:${local.account_id}:instance/*"]
  }

  # CloudWatch agent: disk metrics in our namespace ...
  statement {
    sid       = "AgentMetricsInOurNamespace"
    effect    = "Allow"
    actions   = ["cloudwatch:PutMetricData"]
    resources = ["*"]

    condition {
      test     = "StringEquals"
      variable = "cloudwatch:namespace"
      values   = [var.metrics_namespace]
    }
  }

  # ... and tiered's Prometheus metrics as embedded-metric-format events in our log group.
  statement {
    sid    = "AgentLogsInOurLogGroup"
    effect = "Allow"
    actions = [
      "logs:CreateLogStream",
      "logs:DescribeLogStreams",
      "logs:PutLogEvents",
    ]
    resources = [
      aws_cloudwatch_log_group.metrics.arn,
      "${aws_cloudwatch_log_group.metrics.arn}:*",
    ]
  }
}

resource "aws_iam_role_policy" "node" {
  name   = "tiered-node"
  role   = aws_iam_role.instance.id
  policy = data.aws_iam_policy_document.node.json
}
