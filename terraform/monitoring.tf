# Alarms on the node, its hot volume and tiered's own metrics.
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

# ---------------------------------------------------------------- the instance and its disk

resource "aws_cloudwatch_metric_alarm" "status_check_failed" {
  alarm_name          = "${var.name}-status-check-failed"
  alarm_description   = "The tiered node's instance fails its EC2 status checks (the Auto Scaling group replaces an impaired instance; the replacement re-attaches the hot volume)."
  namespace           = "AWS/EC2"
  metric_name         = "StatusCheckFailed"
  dimensions          = { AutoScalingGroupName = aws_autoscaling_group.node.name }
  statistic           = "Maximum"
  period              = 60
  evaluation_periods  = 3
  comparison_operator = "GreaterThanOrEqualToThreshold"
  threshold           = 1
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.alarm_actions
  ok_actions          = local.alarm_actions
  tags                = local.tags
}

resource "aws_cloudwatch_metric_alarm" "hot_volume_disk_used" {
  alarm_name          = "${var.name}-hot-volume-disk-used"
  alarm_description   = "The hot volume (${local.mount_point}) is more than ${var.disk_used_alarm_percent}% full: grow it (hot_volume_size_gib) or find why data is not flushing to S3."
  namespace           = var.metrics_namespace
  metric_name         = "disk_used_percent"
  dimensions          = { node = var.name, path = local.mount_point, fstype = "ext4" }
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

# ---------------------------------------------------------------- the cold tier

resource "aws_cloudwatch_metric_alarm" "hot_bytes" {
  alarm_name          = "${var.name}-unflushed-hot-bytes"
  alarm_description   = "tiered_hot_bytes (data held only in the hot tier) is above ${var.hot_bytes_alarm_percent}% of max_hot_bytes (${local.max_hot_bytes}); at 100% appends get 503. The flusher is behind or S3 is failing."
  namespace           = var.metrics_namespace
  metric_name         = "tiered_hot_bytes"
  dimensions          = { node = var.name }
  statistic           = "Maximum"
  period              = 60
  evaluation_periods  = 5
  comparison_operator = "GreaterThanThreshold"
  threshold           = floor(local.max_hot_bytes * var.hot_bytes_alarm_percent / 100)
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.alarm_actions
  ok_actions          = local.alarm_actions
  tags                = local.tags
}

resource "aws_cloudwatch_metric_alarm" "flush_failures" {
  alarm_name          = "${var.name}-cold-flush-failures"
  alarm_description   = "tiered_cold_flush_failures_total grows in 3 of the last 5 minutes: flushes to S3 keep failing (flush lag grows; see tiered's log and the unflushed-hot-bytes alarm)."
  namespace           = var.metrics_namespace
  metric_name         = "tiered_cold_flush_failures_total"
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

# Also fires when no metrics arrive at all (tiered or the agent is down, the scrape is
# refused): missing data is breaching.
resource "aws_cloudwatch_metric_alarm" "store_unreachable" {
  alarm_name          = "${var.name}-store-unreachable-or-no-metrics"
  alarm_description   = "tiered_store_reachable is 0 (S3 does not answer tiered's probes; /readyz is 503) or absent (tiered, its scrape or the CloudWatch agent is down) for 5 minutes."
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

# ---------------------------------------------------------------- appends

resource "aws_cloudwatch_metric_alarm" "append_5xx" {
  alarm_name          = "${var.name}-append-5xx"
  alarm_description   = "More than ${var.append_5xx_alarm_percent}% of appends answered 5xx over 5 minutes (tiered_http_requests_total{route=\"${local.append_route}\"})."
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

# Mean latency from the histogram's _sum and _count (CloudWatch has no buckets to take
# percentiles from). Insufficient data is notified too: an agent whose Prometheus
# pipeline drops histograms (README.md) shows up instead of passing silently.
resource "aws_cloudwatch_metric_alarm" "append_latency" {
  alarm_name                = "${var.name}-append-latency"
  alarm_description         = "Mean append latency (tiered_append_seconds sum / count) above ${var.append_latency_alarm_seconds}s in 2 of the last 3 five-minute periods: the hot volume's IOPS or throughput may be exhausted."
  evaluation_periods        = 3
  datapoints_to_alarm       = 2
  comparison_operator       = "GreaterThanThreshold"
  threshold                 = var.append_latency_alarm_seconds
  treat_missing_data        = "missing"
  alarm_actions             = local.alarm_actions
  ok_actions                = local.alarm_actions
  insufficient_data_actions = local.alarm_actions
  tags                      = local.tags

  metric_query {
    id          = "mean_seconds"
    label       = "mean append latency (s)"
    expression  = "IF(appends > 0, seconds / appends, 0)"
    return_data = true
  }

  metric_query {
    id = "seconds"

    metric {
      namespace   = var.metrics_namespace
      metric_name = "tiered_append_seconds_sum"
      dimensions  = { node = var.name }
      stat        = "Sum"
      period      = 300
    }
  }

  metric_query {
    id = "appends"

    metric {
      namespace   = var.metrics_namespace
      metric_name = "tiered_append_seconds_count"
      dimensions  = { node = var.name }
      stat        = "Sum"
      period      = 300
    }
  }
}

# ---------------------------------------------------------------- GC and integrity

resource "aws_cloudwatch_metric_alarm" "gc_errors" {
  alarm_name          = "${var.name}-gc-errors"
  alarm_description   = "tiered_gc_errors_total grew: a GC pass failed to delete or reconcile (it is retried; see `GET /v1/admin/gc` and tiered's log)."
  namespace           = var.metrics_namespace
  metric_name         = "tiered_gc_errors_total"
  dimensions          = { node = var.name }
  statistic           = "Sum"
  period              = 300
  evaluation_periods  = 1
  comparison_operator = "GreaterThanThreshold"
  threshold           = 0
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.alarm_actions
  ok_actions          = local.alarm_actions
  tags                = local.tags
}

resource "aws_cloudwatch_metric_alarm" "integrity_errors" {
  alarm_name          = "${var.name}-integrity-errors"
  alarm_description   = "tiered_integrity_errors_total grew: stored bytes failed their checksum and a read or copy was refused (502 DATA_DAMAGED). Run `tiered verify`; see README.md of tiered."
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

resource "aws_cloudwatch_metric_alarm" "gc_integrity_errors" {
  alarm_name          = "${var.name}-gc-integrity-errors"
  alarm_description   = "tiered_gc_integrity_errors is above 0: reconciliation found objects the metadata references but the bucket lacks. Run `tiered verify`."
  namespace           = var.metrics_namespace
  metric_name         = "tiered_gc_integrity_errors"
  dimensions          = { node = var.name }
  statistic           = "Maximum"
  period              = 300
  evaluation_periods  = 1
  comparison_operator = "GreaterThanThreshold"
  threshold           = 0
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.alarm_actions
  ok_actions          = local.alarm_actions
  tags                = local.tags
}
