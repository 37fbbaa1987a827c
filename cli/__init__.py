"""The `graphsync` command line: a thin click shell over the graphsync library."""
