"""`graphsync run`: the multi-tower graphs of an unchanged script synchronized before first use.

    patching        AutoSync: the TensorFlow entry points patched (Session, finalize, graph extension)
    decide          GraphDecisions: which graph is rewritten, when, and what the user is told
    session_copies  how much of its graph each session has copied into the runtime
    worker          the same on a between-graph worker: servers, meeting, lost workers
"""
