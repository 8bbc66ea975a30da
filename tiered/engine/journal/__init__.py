"""The metadata journal: records in the hot segment log with group commit, snapshots, recovery, and the committer."""
