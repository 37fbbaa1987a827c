"""`graphsync run`: the multi-tower graphs of an unchanged script synchronized before first use.

    patching        AutoSync: the TensorFlow entry points patched (Session, finalize, graph
                    extension, tf.function traces)
    decide          GraphDecisions: which graph is rewritten, when, and what the user is told
    functions       TF2: the steps tf.function traces under a distribution strategy
    session_copies  how much of its graph each session has copied into the runtime
    worker          the same on a between-graph worker: servers, meeting, lost workers

`graphsync.autosync()` does from inside a script what `graphsync run` does around it.
"""


def autosync(**options):
    """From this line on, every multi-tower graph and every step tf.function traces under a
    distribution strategy is synchronized before its first use, exactly as under `graphsync run`
    (options: its keyword arguments — towers, device, strategy, group_size, recompute, on_error,
    quiet, verbose, peer_timeout, heartbeat). Returns the installed BetweenGraphSync: its `reports`
    list every rewrite, `uninstall()` (or a `with` block) ends it."""
    from graphsync.autosync.worker import BetweenGraphSync
    return BetweenGraphSync(**options).install()
