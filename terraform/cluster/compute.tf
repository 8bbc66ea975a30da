# The nodes: one Auto Scaling group of node_count instances across the subnets' zones,
# each booting from the release artifact in the bucket (../templates/user-data.sh).

data "aws_ssm_parameter" "al2023" {
  count = var.ami_id == "" ? 1 : 0
  name  = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-${var.architecture}"
}

locals {
  ami_id = var.ami_id != "" ? var.ami_id : data.aws_ssm_parameter.al2023[0].insecure_value
}

data "aws_ami" "node" {
  filter {
    name   = "image-id"
    values = [local.ami_id]
  }
}

locals {
  venv          = "/opt/tiered/venv"
  wheelhouse    = "/opt/tiered/wheelhouse"
  config_file   = "/etc/tiered/tiered.toml"
  bootstrap_env = "/etc/tiered/bootstrap.env"
  libexec       = "/usr/local/libexec/tiered"
  cwagent_dir   = "/opt/aws/amazon-cloudwatch-agent/etc"

  # templates/tiered.toml.tftpl (as for one node), then the cluster's settings.
  tiered_toml_vars = {
    port             = var.port
    data_dir         = local.data_dir
    fsync            = var.fsync
    max_hot_bytes    = var.max_hot_bytes
    log_level        = var.log_level
    s3_bucket        = aws_s3_bucket.cold.bucket
    s3_prefix        = var.s3_prefix
    s3_region        = local.region
    admin_token_file = local.admin_token_credential_file
    auth             = var.auth
    public_url       = var.public_url
  }
  cluster_toml_vars = {
    shards              = var.shards
    lease_ttl_s         = var.lease_ttl_s
    cluster_secret_file = local.cluster_secret_credential_file
  }
  tiered_toml = "${templatefile("${local.templates}/tiered.toml.tftpl", local.tiered_toml_vars)}${templatefile("${local.templates}/tiered-cluster.toml.tftpl", local.cluster_toml_vars)}"

  # The boot scripts' inputs: names, ids and digests only, never a secret's value.
  bootstrap_env_vars = {
    region                   = local.region
    artifact_bucket          = aws_s3_bucket.cold.bucket
    artifact_prefix          = local.artifact_key_prefix
    artifact_sha256sums      = local.wheelhouse_sums_sha256
    wheelhouse               = local.wheelhouse
    venv                     = local.venv
    config_file              = local.config_file
    enable_units             = "tiered-secrets.service tiered.service"
    start_units              = "tiered.service"
    cwagent_ctl              = "/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl"
    cwagent_config           = "${local.cwagent_dir}/tiered-cloudwatch-agent.json"
    admin_token_parameter    = local.admin_token_parameter_name
    admin_token_file         = local.admin_token_host_file
    cluster_secret_parameter = local.cluster_secret_parameter_name
    cluster_secret_file      = local.cluster_secret_host_file
    node_env_file            = local.node_env_file
    imds_endpoint            = "http://169.254.169.254"
    port                     = var.port
    mount_point              = local.data_dir
    data_dir                 = local.data_dir
    hot_volume_id            = ""
    volume_attach_timeout_s  = 0
  }

  unit_vars = {
    venv                  = local.venv
    config_file           = local.config_file
    data_dir              = local.data_dir
    libexec               = local.libexec
    admin_token_host_file = local.admin_token_host_file
    port                  = var.port
    gc_timer_interval     = "15min"
    requires              = "tiered-secrets.service"
    # The cluster secret, the node's id and URL, and the data dir systemd creates for
    # the service user on the root volume (a cache with object-store durability).
    cluster_service_lines = join("\n", [
      "LoadCredential=cluster-secret:${local.cluster_secret_host_file}",
      "EnvironmentFile=${local.node_env_file}",
      "StateDirectory=tiered",
      "StateDirectoryMode=0750",
    ])
  }

  cwagent_vars = {
    namespace              = var.metrics_namespace
    node                   = var.name
    mount_point            = "/"
    log_group              = aws_cloudwatch_log_group.metrics.name
    prometheus_config_file = "${local.cwagent_dir}/tiered-prometheus.yaml"
    append_route           = local.append_route
  }

  # Every node is scraped under node = <cluster name>: the alarms watch the cluster as
  # one (counters summed over the nodes, gauges at their worst).
  prometheus_vars = {
    port                  = var.port
    node                  = var.name
    admin_token_host_file = local.admin_token_host_file
  }

  cloud_config = {
    write_files = [
      { path = local.bootstrap_env, owner = "root:root", permissions = "0644", content = templatefile("${local.templates}/bootstrap.env.tftpl", local.bootstrap_env_vars) },
      { path = local.config_file, owner = "root:root", permissions = "0644", content = local.tiered_toml },
      { path = "${local.libexec}/user-data", owner = "root:root", permissions = "0755", content = file("${local.templates}/user-data.sh") },
      { path = "${local.libexec}/secrets", owner = "root:root", permissions = "0755", content = file("${local.templates}/secrets.sh") },
      { path = "/etc/systemd/system/tiered-secrets.service", owner = "root:root", permissions = "0644", content = templatefile("${local.templates}/tiered-secrets.service.tftpl", local.unit_vars) },
      { path = "/etc/systemd/system/tiered.service", owner = "root:root", permissions = "0644", content = templatefile("${local.templates}/tiered.service.tftpl", local.unit_vars) },
      { path = local.bootstrap_env_vars.cwagent_config, owner = "root:root", permissions = "0644", content = templatefile("${local.templates}/cloudwatch-agent-cluster.json.tftpl", local.cwagent_vars) },
      { path = local.cwagent_vars.prometheus_config_file, owner = "root:root", permissions = "0644", content = templatefile("${local.templates}/prometheus.yaml.tftpl", local.prometheus_vars) },
    ]
    runcmd = [["${local.libexec}/user-data"]]
  }

  user_data = base64gzip("#cloud-config\n${yamlencode(local.cloud_config)}")
}

resource "aws_launch_template" "node" {
  name_prefix            = "${var.name}-"
  description            = "tiered cluster ${var.name} node"
  image_id               = local.ami_id
  instance_type          = var.instance_type
  ebs_optimized          = true
  update_default_version = true
  user_data              = local.user_data

  iam_instance_profile {
    arn = aws_iam_instance_profile.instance.arn
  }

  # IMDSv2 only, hop limit 1: the role's credentials stay on the host.
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
    tags          = merge(local.tags, { Name = "${var.name}-node" })
  }

  tag_specifications {
    resource_type = "volume"
    tags          = merge(local.tags, { Name = "${var.name}-node-root" })
  }

  tags = local.tags
}

resource "aws_autoscaling_group" "nodes" {
  #checkov:skip=CKV2_AWS_15:Health checks stay EC2 on purpose: /readyz turns 503 on every node at once while S3 is unreachable, and ELB health checks would then replace the whole cluster in a loop; the load balancer uses /readyz to route around an unready node, and the unhealthy-nodes alarm calls a human for a node that stays so.
  name = var.name

  min_size         = var.node_count
  max_size         = var.node_count
  desired_capacity = var.node_count

  # Spread over the subnets' zones; the ASG rebalances across them.
  vpc_zone_identifier = var.subnet_ids

  health_check_type         = "EC2"
  health_check_grace_period = 300
  target_group_arns         = [aws_lb_target_group.nodes.arn]
  # A terminating node hands its shards off (SIGTERM) before it goes.
  default_instance_warmup = 120
  enabled_metrics         = ["GroupDesiredCapacity", "GroupInServiceInstances"]

  launch_template {
    id      = aws_launch_template.node.id
    version = aws_launch_template.node.latest_version
  }

  # A new launch template (artifact, AMI, settings) replaces the nodes one at a time,
  # launching the new node before the old one goes: with object-store durability there
  # is no volume to hand over, and the old node hands its shards off when it stops.
  instance_refresh {
    strategy = "Rolling"

    preferences {
      min_healthy_percentage = 100
      max_healthy_percentage = 150
      instance_warmup        = 120
    }
  }

  depends_on = [
    aws_s3_object.wheelhouse,
    aws_iam_role_policy.tiered_s3,
    aws_iam_role_policy.node,
    aws_ssm_parameter.admin_token,
    aws_ssm_parameter.cluster_secret,
    aws_s3_bucket_server_side_encryption_configuration.cold,
    aws_s3_bucket_versioning.cold,
    aws_s3_bucket_policy.cold,
  ]

  dynamic "tag" {
    for_each = merge(local.tags, { Name = "${var.name}-node" })

    content {
      key                 = tag.key
      value               = tag.value
      propagate_at_launch = true
    }
  }
}
