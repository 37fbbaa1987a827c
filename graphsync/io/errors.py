"""Errors about files: what the command line reports as one line on stderr."""
from graphsync.errors import GraphsyncError


class GraphFileError(GraphsyncError):
    """A file that cannot be read as a graph, or written; the message names the file and the problem."""


class PathError(GraphFileError):
    """Paths that cannot work: a missing input, an output in a missing directory, output == input.
    The command line treats these as usage errors (exit status 2)."""
