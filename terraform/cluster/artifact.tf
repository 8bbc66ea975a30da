# The release artifact (deploy/build-artifact.sh): the wheelhouse is uploaded to the
# bucket, under a prefix named by its version, architecture and digest, and the nodes
# install from it offline. The user data carries the SHA-256 of SHA256SUMS, which
# names the digest of every other file, so an instance installs exactly these bytes
# or nothing.

locals {
  wheelhouse_manifest    = jsondecode(file("${var.wheelhouse_dir}/wheelhouse.json"))
  wheelhouse_sums_sha256 = filesha256("${var.wheelhouse_dir}/SHA256SUMS")
  # SHA256SUMS lines are "<digest>  <file name>".
  wheelhouse_files = toset(concat(["SHA256SUMS"], [
    for line in split("\n", trimspace(file("${var.wheelhouse_dir}/SHA256SUMS"))) : trimspace(substr(line, 64, -1))
  ]))
  # The architecture name the wheelhouse uses for var.architecture.
  wheelhouse_architecture = { x86_64 = "x86_64", arm64 = "aarch64" }[var.architecture]
  artifact_key_prefix     = "${var.artifact_prefix}/tiered-${local.wheelhouse_manifest.tiered_version}-${local.wheelhouse_manifest.architecture}-${substr(local.wheelhouse_sums_sha256, 0, 16)}"
}

resource "aws_s3_object" "wheelhouse" {
  #checkov:skip=CKV_AWS_186:The objects take the bucket's default encryption (SSE-S3, or SSE-KMS with s3_kms_key_arn); they hold published code, not data.
  for_each = local.wheelhouse_files

  bucket       = aws_s3_bucket.cold.id
  key          = "${local.artifact_key_prefix}/${each.value}"
  source       = "${var.wheelhouse_dir}/${each.value}"
  source_hash  = filemd5("${var.wheelhouse_dir}/${each.value}")
  content_type = endswith(each.value, ".whl") ? "application/zip" : "text/plain"
  tags         = local.tags

  # Encryption and the TLS-only policy are in place before any object lands.
  depends_on = [aws_s3_bucket_server_side_encryption_configuration.cold, aws_s3_bucket_policy.cold]

  lifecycle {
    precondition {
      condition     = local.wheelhouse_manifest.architecture == local.wheelhouse_architecture && local.wheelhouse_manifest.python == "3.11"
      error_message = "wheelhouse_dir holds a wheelhouse for ${local.wheelhouse_manifest.architecture} / Python ${local.wheelhouse_manifest.python}; the nodes are ${var.architecture} with Python 3.11 (deploy/build-artifact.sh --arch ${local.wheelhouse_architecture})."
    }
    precondition {
      condition     = !startswith("${var.artifact_prefix}/", "${var.s3_prefix}/") && !startswith("${var.s3_prefix}/", "${var.artifact_prefix}/")
      error_message = "artifact_prefix and s3_prefix must not overlap: tiered owns everything under s3_prefix."
    }
  }
}
