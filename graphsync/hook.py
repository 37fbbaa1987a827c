"""`SyncBatchNormHook`: synchronized batch norm for loops that take hooks and own the session.

    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[graphsync.SyncBatchNormHook()]) as sess:
        ...

MonitoredSession calls every hook's begin() before it finalizes the graph and creates the first
session: the one moment such a loop lets code change the graph.
"""
from __future__ import annotations

import tensorflow as tf

from graphsync.rewrite import rewrite_towers


class SyncBatchNormHook(tf.compat.v1.train.SessionRunHook):
    """Rewrites the default graph in begin() with rewrite_towers(**options); `report` then holds
    the RewriteReport (None before begin())."""

    def __init__(self, **options):
        self.options = options
        self.report = None

    def begin(self):
        self.report = rewrite_towers(tf.compat.v1.get_default_graph(), **self.options)
