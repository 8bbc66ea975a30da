# One node: an Auto Scaling group of exactly one instance (it replaces a lost
# instance), and a separate EBS volume for the hot tier and the journal that
# outlives every instance: the replacement re-attaches it at boot.

data "aws_ssm_parameter" "al2023" {
  count = var.ami_id == "" ? 1 : 0
  name  = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-${var.architecture}"
}

locals {
  ami_id = var.ami_id != "" ? var.ami_id : data.aws_ssm_parameter.al2023[0].insecure_value
}

# Read the AMI for its root device name, so the encrypted root volume settings apply to
# the real root device whatever AMI is used.
data "aws_ami" "node" {
  filter {
    name   = "image-id"
    values = [local.ami_id]
  }
}

resource "aws_ebs_volume" "hot" {
  availability_zone = data.aws_subnet.node.availability_zone
  type              = "gp3"
  size              = var.hot_volume_size_gib
  iops              = var.hot_volume_iops
  throughput        = var.hot_volume_throughput_mibps
  encrypted         = true
  kms_key_id        = var.ebs_kms_key_arn != "" ? var.ebs_kms_key_arn : null
  # The journal holds acknowledged writes that may not be in S3 yet.
  final_snapshot = var.hot_volume_final_snapshot

  tags = merge(local.tags, { Name = "${var.name}-hot" })
}

locals {
  max_hot_bytes = var.max_hot_bytes != null ? var.max_hot_bytes : floor(var.hot_volume_size_gib * 1073741824 / 2)

  venv          = "/opt/tiered/venv"
  wheelhouse    = "/opt/tiered/wheelhouse"
  config_file   = "/etc/tiered/tiered.toml"
  bootstrap_env = "/etc/tiered/bootstrap.env"
  libexec       = "/usr/local/libexec/tiered"
  cwagent_dir   = "/opt/aws/amazon-cloudwatch-agent/etc"

  # Everything templates/tiered.toml.tftpl interpolates (tests/deploy/test_terraform.py renders
  # the template with example values for exactly these keys and loads it with tiered's
  # own config loader).
  tiered_toml_vars = {
    port             = var.port
    data_dir         = local.data_dir
    fsync            = var.fsync
    max_hot_bytes    = local.max_hot_bytes
    log_level        = var.log_level
    s3_bucket        = aws_s3_bucket.cold.bucket
    s3_prefix        = var.s3_prefix
    s3_region        = local.region
    admin_token_file = local.admin_token_credential_file
    auth             = var.auth
    public_url       = var.public_url
  }
  tiered_toml = templatefile("${path.module}/templates/tiered.toml.tftpl", local.tiered_toml_vars)

  # The boot scripts' inputs: names, ids and digests only. The admin token's value never
  # appears here (nor anywhere in the user data): only its parameter name.
  bootstrap_env_vars = {
    region                   = local.region
    artifact_bucket          = aws_s3_bucket.cold.bucket
    artifact_prefix          = local.artifact_key_prefix
    artifact_sha256sums      = local.wheelhouse_sums_sha256
    wheelhouse               = local.wheelhouse
    venv                     = local.venv
    config_file              = local.config_file
    enable_units             = "tiered-hot-volume.service tiered-secrets.service tiered.service tiered-gc.timer"
    start_units              = "tiered.service tiered-gc.timer"
    cwagent_ctl              = "/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl"
    cwagent_config           = "${local.cwagent_dir}/tiered-cloudwatch-agent.json"
    admin_token_parameter    = local.admin_token_parameter_name
    admin_token_file         = local.admin_token_host_file
    cluster_secret_parameter = ""
    cluster_secret_file      = ""
    node_env_file            = ""
    imds_endpoint            = "http://169.254.169.254"
    port                     = var.port
    mount_point              = local.mount_point
    data_dir                 = local.data_dir
    hot_volume_id            = aws_ebs_volume.hot.id
    volume_attach_timeout_s  = var.volume_attach_timeout_s
  }

  unit_vars = {
    venv                  = local.venv
    config_file           = local.config_file
    data_dir              = local.data_dir
    libexec               = local.libexec
    admin_token_host_file = local.admin_token_host_file
    port                  = var.port
    gc_timer_interval     = var.gc_timer_interval
    requires              = "tiered-hot-volume.service tiered-secrets.service"
    cluster_service_lines = ""
  }

  cwagent_vars = {
    namespace              = var.metrics_namespace
    node                   = var.name
    mount_point            = local.mount_point
    log_group              = aws_cloudwatch_log_group.metrics.name
    prometheus_config_file = "${local.cwagent_dir}/tiered-prometheus.yaml"
    append_route           = local.append_route
  }

  prometheus_vars = {
    port                  = var.port
    node                  = var.name
    admin_token_host_file = local.admin_token_host_file
  }

  # What cloud-init writes, then runs (runcmd: user-data.sh, once per instance).
  cloud_config = {
    write_files = [
      { path = local.bootstrap_env, owner = "root:root", permissions = "0644", content = templatefile("${path.module}/templates/bootstrap.env.tftpl", local.bootstrap_env_vars) },
      { path = local.config_file, owner = "root:root", permissions = "0644", content = local.tiered_toml },
      { path = "${local.libexec}/user-data", owner = "root:root", permissions = "0755", content = file("${path.module}/templates/user-data.sh") },
      { path = "${local.libexec}/hot-volume", owner = "root:root", permissions = "0755", content = file("${path.module}/templates/hot-volume.sh") },
      { path = "${local.libexec}/secrets", owner = "root:root", permissions = "0755", content = file("${path.module}/templates/secrets.sh") },
      { path = "/etc/systemd/system/tiered-hot-volume.service", owner = "root:root", permissions = "0644", content = templatefile("${path.module}/templates/tiered-hot-volume.service.tftpl", local.unit_vars) },
      { path = "/etc/systemd/system/tiered-secrets.service", owner = "root:root", permissions = "0644", content = templatefile("${path.module}/templates/tiered-secrets.service.tftpl", local.unit_vars) },
      { path = "/etc/systemd/system/tiered.service", owner = "root:root", permissions = "0644", content = templatefile("${path.module}/templates/tiered.service.tftpl", local.unit_vars) },
      { path = "/etc/systemd/system/tiered-gc.service", owner = "root:root", permissions = "0644", content = templatefile("${path.module}/templates/tiered-gc.service.tftpl", local.unit_vars) },
      { path = "/etc/systemd/system/tiered-gc.timer", owner = "root:root", permissions = "0644", content = templatefile("${path.module}/templates/tiered-gc.timer.tftpl", local.unit_vars) },
      { path = local.bootstrap_env_vars.cwagent_config, owner = "root:root", permissions = "0644", content = templatefile("${path.module}/templates/cloudwatch-agent.json.tftpl", local.cwagent_vars) },
      { path = local.cwagent_vars.prometheus_config_file, owner = "root:root", permissions = "0644", content = templatefile("${path.module}/templates/prometheus.yaml.tftpl", local.prometheus_vars) },
    ]
    runcmd = [["${local.libexec}/user-data"]]
  }

  # One cloud-config part, gzipped (cloud-init inflates it; the 16 KiB user-data limit
  # applies to the compressed form). Built in HCL: no cloudinit provider needed.
  user_data = base64gzip("#cloud-config\n${yamlencode(local.cloud_config)}")
}

resource "aws_launch_template" "node" {
  name_prefix            = "${var.name}-"
  description            = "tiered node ${var.name}"
  image_id               = local.ami_id
  instance_type          = var.instance_type
  ebs_optimized          = true
  update_default_version = true
  user_data              = local.user_data

  iam_instance_profile {
    arn = aws_iam_instance_profile.instance.arn
  }

  # IMDSv2 only; a hop limit of 1 keeps the role's credentials away from anything
  # that is not on the host itself (containers behind a bridge, forwarded packets).
  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
    instance_metadata_tags      = "disabled"
  }

  monitoring {
    enabled = true
  }

  # No key pair: shell access is Session Manager only.
  network_interfaces {
    device_index                = 0
    associate_public_ip_address = false
    delete_on_termination       = true
    security_groups             = [aws_security_group.node.id]
  }

  block_device_mappings {
    device_name = data.aws_ami.node.root_device_name

    ebs {
      volume_type           = "gp3"
      volume_size           = var.root_volume_size_gib
      encrypted             = true
      kms_key_id            = var.ebs_kms_key_arn != "" ? var.ebs_kms_key_arn : null
      delete_on_termination = true
    }
  }

  tag_specifications {
    resource_type = "instance"
    tags          = merge(local.tags, { Name = var.name })
  }

  tag_specifications {
    resource_type = "volume"
    tags          = merge(local.tags, { Name = "${var.name}-root" })
  }

  tags = local.tags
}

resource "aws_autoscaling_group" "node" {
  #checkov:skip=CKV2_AWS_15:Health checks stay EC2 even with target groups on purpose: /readyz turns 503 while S3 is unreachable, and replacing the only instance then would only add a restart to an outage; the target group uses /readyz to route traffic, not to replace the node.
  name = var.name

  # Exactly one instance: one writer per hot volume and per S3 prefix.
  min_size         = 1
  max_size         = 1
  desired_capacity = 1

  # One subnet, so one availability zone: the one the hot volume lives in.
  vpc_zone_identifier = [var.subnet_id]

  # EC2 status checks replace a dead instance; see the skip above for why not ELB.
  health_check_type         = "EC2"
  health_check_grace_period = 300
  target_group_arns         = var.target_group_arns

  launch_template {
    id      = aws_launch_template.node.id
    version = aws_launch_template.node.latest_version
  }

  # A launch template change replaces the instance: the old one terminates first
  # (it must release the hot volume), then the new one boots and attaches it.
  instance_refresh {
    strategy = "Rolling"

    preferences {
      min_healthy_percentage = 0
      max_healthy_percentage = 100
    }
  }

  # The instance must boot with its permissions, its token and an encrypted, versioned
  # bucket in place: nothing else orders these before the launch.
  depends_on = [
    aws_s3_object.wheelhouse,
    aws_iam_role_policy.tiered_s3,
    aws_iam_role_policy.node,
    aws_ssm_parameter.admin_token,
    aws_s3_bucket_server_side_encryption_configuration.cold,
    aws_s3_bucket_versioning.cold,
    aws_s3_bucket_policy.cold,
  ]

  dynamic "tag" {
    for_each = merge(local.tags, { Name = var.name })

    content {
      key                 = tag.key
      value               = tag.value
      propagate_at_launch = true
    }
  }
}
