"""The exception type graphsync raises, and its warning category."""


class GraphsyncError(Exception):
    """A graph graphsync cannot rewrite; the message is one line naming the op and the fix."""


class NoTowersError(GraphsyncError):
    """Batch norm, but no towers to synchronize across: `graphsync run` leaves such graphs alone,
    saying so by default when `parallel_structure` (scopes that look like towers but are not
    named as such), else only with -v."""

    def __init__(self, message: str, parallel_structure: bool = False):
        super().__init__(message)
        self.parallel_structure = parallel_structure


class GraphsyncWarning(UserWarning):
    """The rewrite holds, but something about the graph deserves the user's attention."""
