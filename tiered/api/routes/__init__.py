"""Routes, one module per feature: parse the request, call the feature's service, format the answer."""
