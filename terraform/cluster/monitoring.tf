# Alarms on the cluster: its nodes (Auto Scaling, the load balancer's health checks),
# shard takeovers, the object store (stalls, reachability), the leases' window, appends
# and integrity. The CloudWatch agent on every node scrapes /metrics under
# node = var.name (templates/cloudwatch-agent-cluster.json.tftpl), so each series is the
# cluster's: counters summed over the nodes, gauges at their worst (Minimum / Maximum).
#
# tiered's Prometheus metrics (GET /metrics, an admin route) are scraped on loopback
# by the CloudWatch agent (templates/prometheus.yaml.tftpl, with the admin token
# file) and shipped as embedded-metric-format events into the log group below;
# CloudWatch turns them into metrics in var.metrics_namespace with the dimension
# node = var.name (templates/cloudwatch-agent.json.tftpl). Counters arrive as
# per-scrape deltas, so alarms on *_total use the Sum statistic.

locals {
  create_alarm_topic = var.alarm_sns_topic_arn == ""
  alarm_topic_arn    = local.create_alarm_topic ? aws_sns_topic.alarms[0].arn : var.alarm_sns_topic_arn
  alarm_actions      = [local.alarm_topic_arn]

  # The `route` label value of appends in tiered_http_requests_total{route,status}.
  append_route = "append"
}

resource "aws_cloudwatch_log_group" "metrics" {
  #checkov:skip=CKV_AWS_158:The group holds only metric values in embedded metric format (numbers and label names, no stream data, no secrets); CloudWatch Logs encrypts it at rest with its own key. A customer key here would add a key policy for logs.amazonaws.com and protect nothing sensitive.
  #checkov:skip=CKV_AWS_338:A year of raw metric events is cost without use: the metrics extracted from them are kept by CloudWatch for 15 months regardless. Retention is a variable (log_retention_days).
  name              = "/tiered/${var.name}/prometheus"
  retention_in_days = var.log_retention_days
  tags              = local.tags
}

resource "aws_sns_topic" "alarms" {
  #checkov:skip=CKV_AWS_26:Unencrypted unless alarm_sns_kms_key_arn is set: CloudWatch cannot publish to a topic encrypted with the AWS-managed aws/sns key, and a customer key needs a key policy for cloudwatch.amazonaws.com that this module cannot write for a key it does not own. Alarm notifications carry metric names and states, not data.
  count = local.create_alarm_topic ? 1 : 0

  name              = "${var.name}-alarms"
  kms_master_key_id = var.alarm_sns_kms_key_arn != "" ? var.alarm_sns_kms_key_arn : null
  tags              = local.tags
}

# ---------------------------------------------------------------- nodes

resource "aws_cloudwatch_metric_alarm" "nodes_in_service" {
  alarm_name          = "${var.name}-nodes-in-service"
  alarm_description   = "Fewer than ${var.node_count} nodes in service for 5 minutes: the Auto Scaling group cannot launch or keep a node (capacity, AMI, user data: see the instance's console output and /var/log/cloud-init-output.log). The other nodes serve every shard meanwhile."
  namespace           = "AWS/AutoScaling"
  metric_name         = "GroupInServiceInstances"
  dimensions          = { AutoScalingGroupName = aws_autoscaling_group.nodes.name }
  statistic           = "Minimum"
  period              = 60
  evaluation_periods  = 5
  comparison_operator = "LessThanThreshold"
  threshold           = var.node_count
  treat_missing_data  = "breaching"
  alarm_actions       = local.alarm_actions
  ok_actions          = local.alarm_actions
  tags                = local.tags
}

resource "aws_cloudwatch_metric_alarm" "unhealthy_nodes" {
  alarm_name          = "${var.name}-unhealthy-nodes"
  alarm_description   = "A node fails the load balancer's GET /readyz for 5 minutes (not recovered, store unreachable, or not serving in the cluster); traffic goes to the others. Nodes are not replaced for this (EC2 health checks): look at `journalctl -u tiered` on it, and replace it by hand if it stays so."
  namespace           = "AWS/NetworkELB"
  metric_name         = "UnHealthyHostCount"
  dimensions          = { TargetGroup = aws_lb_target_group.nodes.arn_suffix, LoadBalancer = aws_lb.cluster.arn_suffix }
  statistic           = "Maximum"
  period              = 60
  evaluation_periods  = 5
  comparison_operator = "GreaterThanThreshold"
  threshold           = 0
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.alarm_actions
  ok_actions          = local.alarm_actions
  tags                = local.tags
}

# ---------------------------------------------------------------- shards and leases

resource "aws_cloudwatch_metric_alarm" "shard_takeovers" {
  alarm_name          = "${var.name}-shard-takeovers"
  alarm_description   = "More than ${var.takeover_alarm_threshold} shards were taken over in 5 minutes (tiered_cluster_shards_taken_total{from=\"takeover\"}): a node died, was replaced, or stopped renewing its leases (frozen, cut off from S3). Acknowledged writes are safe (object-store durability); check the nodes-in-service and window-closed alarms and the log line 'took shard N at epoch E (from NODE)'."
  namespace           = var.metrics_namespace
  metric_name         = "tiered_cluster_shards_taken_total"
  dimensions          = { node = var.name, from = "takeover" }
  statistic           = "Sum"
  period              = 300
  evaluation_periods  = 1
  comparison_operator = "GreaterThanThreshold"
  threshold           = var.takeover_alarm_threshold
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.alarm_actions
  ok_actions          = local.alarm_actions
  tags                = local.tags
}

resource "aws_cloudwatch_metric_alarm" "window_closed" {
  alarm_name          = "${var.name}-lease-window-closed"
  alarm_description   = "A node's lease window was closed (tiered_cluster_window_open = 0) in 2 of 3 minutes: its heartbeats do not reach S3, so it stops acknowledging and its shards will be taken over."
  namespace           = var.metrics_namespace
  metric_name         = "tiered_cluster_window_open"
  dimensions          = { node = var.name }
  statistic           = "Minimum"
  period              = 60
  evaluation_periods  = 3
  datapoints_to_alarm = 2
  comparison_operator = "LessThanThreshold"
  threshold           = 1
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.alarm_actions
  ok_actions          = local.alarm_actions
  tags                = local.tags
}

# ---------------------------------------------------------------- the object store

resource "aws_cloudwatch_metric_alarm" "store_stalls" {
  alarm_name          = "${var.name}-store-stalls"
  alarm_description   = "tiered_store_stalls_total grows in 3 of 5 minutes: object-store calls are abandoned at their deadline (S3 slow or unreachable from some node). With object-store durability appends wait for S3: expect 503s and latency."
  namespace           = var.metrics_namespace
  metric_name         = "tiered_store_stalls_total"
  dimensions          = { node = var.name }
  statistic           = "Sum"
  period              = 60
  evaluation_periods  = 5
  datapoints_to_alarm = 3
  comparison_operator = "GreaterThanThreshold"
  threshold           = 0
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.alarm_actions
  ok_actions          = local.alarm_actions
  tags                = local.tags
}

resource "aws_cloudwatch_metric_alarm" "store_unreachable" {
  alarm_name          = "${var.name}-store-unreachable-or-no-metrics"
  alarm_description   = "tiered_store_reachable is 0 on some node (S3 does not answer its probes; its /readyz is 503) or absent (no node's metrics arrive: tiered, the scrape or the agent is down) for 5 minutes."
  namespace           = var.metrics_namespace
  metric_name         = "tiered_store_reachable"
  dimensions          = { node = var.name }
  statistic           = "Minimum"
  period              = 60
  evaluation_periods  = 5
  comparison_operator = "LessThanThreshold"
  threshold           = 1
  treat_missing_data  = "breaching"
  alarm_actions       = local.alarm_actions
  ok_actions          = local.alarm_actions
  tags                = local.tags
}

# ---------------------------------------------------------------- appends, integrity, disk

resource "aws_cloudwatch_metric_alarm" "append_5xx" {
  alarm_name          = "${var.name}-append-5xx"
  alarm_description   = "More than ${var.append_5xx_alarm_percent}% of appends answered 5xx over 5 minutes (tiered_http_requests_total{route=\"${local.append_route}\"}, all nodes)."
  evaluation_periods  = 1
  comparison_operator = "GreaterThanThreshold"
  threshold           = var.append_5xx_alarm_percent
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.alarm_actions
  ok_actions          = local.alarm_actions
  tags                = local.tags

  metric_query {
    id          = "percent_5xx"
    label       = "append 5xx (%)"
    expression  = "IF(appends > 0, 100 * FILL(errors, 0) / appends, 0)"
    return_data = true
  }

  metric_query {
    id = "appends"

    metric {
      namespace   = var.metrics_namespace
      metric_name = "tiered_http_requests_total"
      dimensions  = { node = var.name, route = local.append_route }
      stat        = "Sum"
      period      = 300
    }
  }

  metric_query {
    id = "errors"

    metric {
      namespace   = var.metrics_namespace
      metric_name = "tiered_http_requests_total"
      dimensions  = { node = var.name, route = local.append_route, status_class = "5xx" }
      stat        = "Sum"
      period      = 300
    }
  }
}

resource "aws_cloudwatch_metric_alarm" "integrity_errors" {
  alarm_name          = "${var.name}-integrity-errors"
  alarm_description   = "tiered_integrity_errors_total grew on some node: stored bytes failed their checksum and a read or copy was refused (502 DATA_DAMAGED). Run `tiered verify`."
  namespace           = var.metrics_namespace
  metric_name         = "tiered_integrity_errors_total"
  dimensions          = { node = var.name }
  statistic           = "Sum"
  period              = 60
  evaluation_periods  = 1
  comparison_operator = "GreaterThanThreshold"
  threshold           = 0
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.alarm_actions
  ok_actions          = local.alarm_actions
  tags                = local.tags
}

resource "aws_cloudwatch_metric_alarm" "disk_used" {
  alarm_name          = "${var.name}-root-disk-used"
  alarm_description   = "Some node's root volume (OS, venv, data dir cache) is more than ${var.disk_used_alarm_percent}% full: raise root_volume_size_gib or lower max_hot_bytes."
  namespace           = var.metrics_namespace
  metric_name         = "disk_used_percent"
  dimensions          = { node = var.name, path = "/", fstype = "xfs" }
  statistic           = "Maximum"
  period              = 300
  evaluation_periods  = 1
  comparison_operator = "GreaterThanThreshold"
  threshold           = var.disk_used_alarm_percent
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.alarm_actions
  ok_actions          = local.alarm_actions
  tags                = local.tags
}
