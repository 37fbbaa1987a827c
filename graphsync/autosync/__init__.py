"""`graphsync run`: the multi-tower graphs of an unchanged script synchronized before first use.

    patching        the TensorFlow entry points patched (Session, finalize, graph extension)
    session_copies  how much of its graph each session has copied into the runtime
    worker          the same on a between-graph worker: servers, meeting, lost workers
"""
