"""Who may do what to which bucket: credentials, tiered-issued tokens, JWTs, and the one scope check.

Two ways to authenticate (``tokens``: bearer tokens tiered issues per bucket;
``jwt``: access tokens from the deployment's identity provider) end in one
``Principal`` and one authorization rule (``credentials.authorize``). The HTTP
side is one middleware, ``tiered.api.kit.middleware.auth``.
"""
