# A network load balancer across the subnets' zones: TCP (or TLS with certificate_arn)
# to the nodes' service port, so long-polls, SSE and HTTP/2 pass through untouched. Any
# node answers any request (it forwards to the shard's owner), so the balancer needs no
# affinity; its health check is GET /readyz, which is 200 only on a node that finished
# recovery, reaches the store and serves in the cluster.

resource "aws_lb" "cluster" {
  #checkov:skip=CKV_AWS_91:No access logs by default: a network load balancer logs only TLS listeners, into a separately governed bucket; tiered's own access log and metrics cover requests.
  #checkov:skip=CKV_AWS_150:Deletion protection is off so `terraform destroy` works as written; the data lives in the bucket (force_destroy = false), not in the balancer.
  name                             = "${var.name}-nlb"
  internal                         = var.load_balancer_internal
  load_balancer_type               = "network"
  subnets                          = var.subnet_ids
  security_groups                  = [aws_security_group.lb.id]
  enable_cross_zone_load_balancing = true
  tags                             = local.tags
}

resource "aws_lb_target_group" "nodes" {
  name                 = "${var.name}-nodes"
  port                 = var.port
  protocol             = "TCP"
  vpc_id               = local.vpc_id
  target_type          = "instance"
  deregistration_delay = 30
  # Live reads hold connections open: keep them on their node until it leaves.
  connection_termination = false

  health_check {
    protocol            = "HTTP"
    path                = "/readyz"
    port                = "traffic-port"
    matcher             = "200"
    interval            = 10
    timeout             = 5
    healthy_threshold   = 2
    unhealthy_threshold = 2
  }

  tags = local.tags
}

resource "aws_lb_listener" "cluster" {
  #checkov:skip=CKV_AWS_2:A network load balancer listens TCP or TLS, not HTTP(S); TLS with certificate_arn (recommended), TCP without.
  #checkov:skip=CKV_AWS_103:TLS 1.2 minimum is set (ssl_policy) whenever the listener is TLS; a TCP listener has no policy.
  load_balancer_arn = aws_lb.cluster.arn
  port              = var.listener_port
  protocol          = var.certificate_arn != "" ? "TLS" : "TCP"
  certificate_arn   = var.certificate_arn != "" ? var.certificate_arn : null
  ssl_policy        = var.certificate_arn != "" ? "ELBSecurityPolicy-TLS13-1-2-2021-06" : null

  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.nodes.arn
  }

  tags = local.tags
}
