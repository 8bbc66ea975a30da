# The cold tier: one bucket that every node of the cluster shares; the nodes write only
# under "${var.s3_prefix}/" (and read the release artifact under var.artifact_prefix).

resource "aws_s3_bucket" "cold" {
  #checkov:skip=CKV_AWS_18:No server access logging: it needs a second, separately governed log bucket per deployment; object-level audit belongs in a CloudTrail data-event trail the account owner runs.
  #checkov:skip=CKV_AWS_144:No cross-region replication: the cluster's state is a set of objects written with conditional writes in one region (leases, manifest chains, WAL); an asynchronously replicated copy is not a consistent point in time a cluster could start from, so disaster recovery needs a procedure of its own (out of scope here).
  #checkov:skip=CKV2_AWS_62:No event notifications: nothing consumes bucket events; the cluster's nodes are the only readers and writers of its prefix.
  #checkov:skip=CKV_AWS_145:SSE-S3 is the default on purpose (no per-request KMS cost or quota); SSE-KMS with a customer key is one variable away (s3_kms_key_arn) and then grants the instance role exactly kms:GenerateDataKey and kms:Decrypt.
  bucket        = var.bucket_name != "" ? var.bucket_name : null
  bucket_prefix = var.bucket_name == "" ? "${var.name}-cold-" : null

  # Never let `terraform destroy` delete cold data: the journal references every object.
  force_destroy = false

  tags = local.tags
}

resource "aws_s3_bucket_public_access_block" "cold" {
  bucket = aws_s3_bucket.cold.id

  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "cold" {
  bucket = aws_s3_bucket.cold.id

  rule {
    # ACLs off: access is decided by IAM and the bucket policy alone.
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "cold" {
  bucket = aws_s3_bucket.cold.id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = length(var.s3_kms_key_arn) > 0 ? "aws:kms" : "AES256"
      kms_master_key_id = length(var.s3_kms_key_arn) > 0 ? var.s3_kms_key_arn : null
    }
    # A bucket key cuts KMS requests (and their cost and throttling) per object read/write.
    bucket_key_enabled = var.s3_kms_key_arn != ""
  }
}

resource "aws_s3_bucket_versioning" "cold" {
  bucket = aws_s3_bucket.cold.id

  versioning_configuration {
    # Versioning turns a delete (tiered's GC, a mistake, a compromised role) into a
    # recoverable delete marker until the noncurrent version expires (see README.md).
    status = "Enabled"
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "cold" {
  bucket = aws_s3_bucket.cold.id

  # Lifecycle rules on a versioned bucket must wait for versioning to be configured.
  depends_on = [aws_s3_bucket_versioning.cold]

  rule {
    id     = "abort-incomplete-multipart-uploads"
    status = "Enabled"

    filter {}

    abort_incomplete_multipart_upload {
      days_after_initiation = var.abort_incomplete_multipart_upload_days
    }
  }

  rule {
    id     = "expire-noncurrent-versions"
    status = "Enabled"

    filter {}

    # What tiered's GC deleted (and what bucket erasure released) is physically
    # removed this many days after the delete.
    noncurrent_version_expiration {
      noncurrent_days = var.noncurrent_version_expiration_days
    }

    # Then drop the delete markers left with no versions behind them, so listings stay fast.
    expiration {
      expired_object_delete_marker = true
    }
  }
}

data "aws_iam_policy_document" "bucket" {
  statement {
    sid     = "DenyInsecureTransport"
    effect  = "Deny"
    actions = ["s3:*"]
    resources = [
      aws_s3_bucket.cold.arn,
      "${aws_s3_bucket.cold.arn}/*",
    ]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_s3_bucket_policy" "cold" {
  bucket = aws_s3_bucket.cold.id
  policy = data.aws_iam_policy_document.bucket.json

  # A bucket policy PUT fails while the public access block is still being applied.
  depends_on = [aws_s3_bucket_public_access_block.cold]
}
