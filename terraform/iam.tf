# The instance role: least privilege, matched to what the code and the boot scripts do.

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
  name                 = "${var.name}-instance"
  description          = "tiered node ${var.name}: cold tier under s3://${aws_s3_bucket.cold.bucket}/${var.s3_prefix}/, its release artifact, its hot volume, its admin token, Session Manager and CloudWatch."
  assume_role_policy   = data.aws_iam_policy_document.assume_ec2.json
  permissions_boundary = var.iam_permissions_boundary_arn != "" ? var.iam_permissions_boundary_arn : null
  tags                 = local.tags
}

resource "aws_iam_instance_profile" "instance" {
  name = "${var.name}-instance"
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
  # Boot: read the admin token (tiered-secrets.service).
  statement {
    sid       = "ReadAdminToken"
    effect    = "Allow"
    actions   = ["ssm:GetParameter"]
    resources = [local.admin_token_parameter_arn]
  }

  dynamic "statement" {
    for_each = var.admin_token_kms_key_arn != "" ? [var.admin_token_kms_key_arn] : []

    content {
      sid       = "AdminTokenKmsViaSsm"
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

  # Boot: attach the hot volume (tiered-hot-volume.service) - this volume, to an
  # instance of this node only.
  statement {
    sid       = "AttachTheHotVolume"
    effect    = "Allow"
    actions   = ["ec2:AttachVolume"]
    resources = [aws_ebs_volume.hot.arn]
  }

  statement {
    sid       = "AttachToThisNodesInstances"
    effect    = "Allow"
    actions   = ["ec2:AttachVolume"]
    resources = ["arn:${local.partition}:ec2:${local.region}:${local.account_id}:instance/*"]

    condition {
      test     = "StringEquals"
      variable = "aws:ResourceTag/${local.node_tag_key}"
      values   = [var.name]
    }
  }

  # DescribeVolumes has no resource-level permissions: it is "*" or nothing. It
  # reveals volume metadata only; the boot script waits on the volume's state with it.
  statement {
    sid       = "WaitForTheHotVolume"
    effect    = "Allow"
    actions   = ["ec2:DescribeVolumes"]
    resources = ["*"]
  }

  # Attaching a volume encrypted with a customer key makes EC2 create a grant on the
  # key on the caller's behalf.
  dynamic "statement" {
    for_each = var.ebs_kms_key_arn != "" ? [var.ebs_kms_key_arn] : []

    content {
      sid       = "HotVolumeKmsGrantViaEc2"
      effect    = "Allow"
      actions   = ["kms:CreateGrant"]
      resources = [statement.value]

      condition {
        test     = "Bool"
        variable = "kms:GrantIsForAWSResource"
        values   = ["true"]
      }

      condition {
        test     = "StringEquals"
        variable = "kms:ViaService"
        values   = ["ec2.${local.region}.amazonaws.com"]
      }
    }
  }

  # Session Manager instead of SSH. These are the actions AWS documents as the minimum
  # for Session Manager; AmazonSSMManagedInstanceCore is not used because it also
  # grants ssm:GetParameter(s) on every parameter in the account. ssmmessages has no
  # resource-level permissions.
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

  # CloudWatch agent: disk metrics (PutMetricData has no resource-level permissions;
  # the namespace condition is the narrowest scope it allows) ...
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

  # ... and tiered's Prometheus metrics, shipped as embedded-metric-format log events
  # into the one log group the module creates.
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
