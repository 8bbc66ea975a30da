"""Every code block of README.md and docs/ run as written."""
