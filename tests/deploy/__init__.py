"""Tests of what ships: the lock, the wheelhouse, the image, terraform/ and its user data, the Helm chart, the IAM policy."""
