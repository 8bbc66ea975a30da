"""Subscriptions (protocol sections 6 and 7): records, pure state, views, service, webhook delivery."""
