"""The exception type graphsync raises, and its warning category."""


class GraphsyncError(Exception):
    """A graph graphsync cannot rewrite; the message is one line naming the op and the fix."""


class NoTowersError(GraphsyncError):
    """Batch norm, but no towers to synchronize across: `graphsync run` leaves such graphs alone."""


class GraphsyncWarning(UserWarning):
    """The rewrite holds, but something about the graph deserves the user's attention."""
