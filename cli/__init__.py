"""The `graphsync` command line: a thin click shell over the graphsync library."""
import sys

try:
    import graphsync  # noqa: F401  # says in one line what it needs when TensorFlow is missing or too old
except ImportError as missing:
    sys.exit(f"graphsync: error: {missing}")
