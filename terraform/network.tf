# The node's security group: the service port from the allowed sources only; no SSH
# (Session Manager instead); egress only HTTPS.

resource "aws_security_group" "node" {
  name_prefix = "${var.name}-node-"
  description = "tiered node ${var.name}: service port from allowed sources, HTTPS out"
  vpc_id      = data.aws_subnet.node.vpc_id
  tags        = merge(local.tags, { Name = "${var.name}-node" })

  # Rules are separate resources (below); a replacement group comes up before the old
  # one goes so the launch template never points at a deleted group.
  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "service_from_cidr" {
  for_each = toset(var.allowed_cidrs)

  security_group_id = aws_security_group.node.id
  description       = "tiered HTTP (Durable Streams) from ${each.value}"
  ip_protocol       = "tcp"
  from_port         = var.port
  to_port           = var.port
  cidr_ipv4         = each.value
  tags              = local.tags
}

resource "aws_vpc_security_group_ingress_rule" "service_from_security_group" {
  for_each = toset(var.allowed_security_group_ids)

  security_group_id            = aws_security_group.node.id
  description                  = "tiered HTTP (Durable Streams) from ${each.value}"
  ip_protocol                  = "tcp"
  from_port                    = var.port
  to_port                      = var.port
  referenced_security_group_id = each.value
  tags                         = local.tags
}

# S3 is always reachable over HTTPS through AWS's managed prefix list for the region
# (it is what an S3 gateway endpoint routes; without one, traffic goes via NAT).
data "aws_ec2_managed_prefix_list" "s3" {
  name = "com.amazonaws.${local.region}.s3"
}

resource "aws_vpc_security_group_egress_rule" "https_to_s3" {
  security_group_id = aws_security_group.node.id
  description       = "HTTPS to S3 (the cold tier)"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  prefix_list_id    = data.aws_ec2_managed_prefix_list.s3.id
  tags              = local.tags
}

# SSM, CloudWatch, KMS and EC2 APIs, and at boot the package repository and PyPI.
# Their addresses are not a stable list, hence 0.0.0.0/0 by default; narrow it with
# VPC interface endpoints and a package mirror (README.md). DNS, NTP and instance
# metadata go to link-local AWS services that security groups do not filter.
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
