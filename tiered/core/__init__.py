"""What every layer uses and that uses nothing of tiered: error codes, the one clock, ids, parsing, content types, globs, the small ports jobs depend on, settings, log lines."""
