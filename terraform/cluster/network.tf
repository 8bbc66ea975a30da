# Two security groups: the load balancer's (the listener, from the allowed sources) and
# the nodes' (the service port from the load balancer and from each other: a node
# forwards a request to the shard's owner). No SSH (Session Manager instead); the nodes'
# egress is HTTPS only.

resource "aws_security_group" "lb" {
  name_prefix = "${var.name}-lb-"
  description = "tiered cluster ${var.name}: load balancer listener from allowed sources"
  vpc_id      = local.vpc_id
  tags        = merge(local.tags, { Name = "${var.name}-lb" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "listener_from_cidr" {
  for_each = toset(var.allowed_cidrs)

  security_group_id = aws_security_group.lb.id
  description       = "tiered (Durable Streams) from ${each.value}"
  ip_protocol       = "tcp"
  from_port         = var.listener_port
  to_port           = var.listener_port
  cidr_ipv4         = each.value
  tags              = local.tags
}

resource "aws_vpc_security_group_ingress_rule" "listener_from_security_group" {
  for_each = toset(var.allowed_security_group_ids)

  security_group_id            = aws_security_group.lb.id
  description                  = "tiered (Durable Streams) from ${each.value}"
  ip_protocol                  = "tcp"
  from_port                    = var.listener_port
  to_port                      = var.listener_port
  referenced_security_group_id = each.value
  tags                         = local.tags
}

resource "aws_vpc_security_group_egress_rule" "lb_to_nodes" {
  security_group_id            = aws_security_group.lb.id
  description                  = "to the nodes' service port (traffic and /readyz health checks)"
  ip_protocol                  = "tcp"
  from_port                    = var.port
  to_port                      = var.port
  referenced_security_group_id = aws_security_group.node.id
  tags                         = local.tags
}

resource "aws_security_group" "node" {
  name_prefix = "${var.name}-node-"
  description = "tiered cluster ${var.name} nodes: service port from the load balancer and the other nodes, HTTPS out"
  vpc_id      = local.vpc_id
  tags        = merge(local.tags, { Name = "${var.name}-node" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "service_from_lb" {
  security_group_id            = aws_security_group.node.id
  description                  = "tiered from the load balancer (traffic and health checks)"
  ip_protocol                  = "tcp"
  from_port                    = var.port
  to_port                      = var.port
  referenced_security_group_id = aws_security_group.lb.id
  tags                         = local.tags
}

resource "aws_vpc_security_group_ingress_rule" "service_from_nodes" {
  security_group_id            = aws_security_group.node.id
  description                  = "tiered from the other nodes (forwarded requests, signed node-to-node calls)"
  ip_protocol                  = "tcp"
  from_port                    = var.port
  to_port                      = var.port
  referenced_security_group_id = aws_security_group.node.id
  tags                         = local.tags
}

resource "aws_vpc_security_group_egress_rule" "service_to_nodes" {
  security_group_id            = aws_security_group.node.id
  description                  = "to the other nodes' service port (forwarding)"
  ip_protocol                  = "tcp"
  from_port                    = var.port
  to_port                      = var.port
  referenced_security_group_id = aws_security_group.node.id
  tags                         = local.tags
}

data "aws_ec2_managed_prefix_list" "s3" {
  name = "com.amazonaws.${local.region}.s3"
}

resource "aws_vpc_security_group_egress_rule" "https_to_s3" {
  security_group_id = aws_security_group.node.id
  description       = "HTTPS to S3 (the cold tier, the WAL, the release artifact)"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  prefix_list_id    = data.aws_ec2_managed_prefix_list.s3.id
  tags              = local.tags
}

# SSM, CloudWatch and KMS APIs, and at boot the Amazon Linux repositories: their
# addresses are not a stable list, hence 0.0.0.0/0 by default; narrow it with VPC
# interface endpoints (terraform/README.md, Network).
resource "aws_vpc_security_group_egress_rule" "https" {
  for_each = toset(var.egress_https_cidrs)

  security_group_id = aws_security_group.node.id
  description       = "HTTPS to AWS APIs and package repositories via ${each.value}"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_ipv4         = each.value
  tags              = local.tags
}
