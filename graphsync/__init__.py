"""graphsync: synchronized batch norm for TF1-style multi-tower graphs, without touching model code.

    import graphsync
    report = graphsync.rewrite_towers()   # after building the towers (and, ideally, their gradients)
"""
from graphsync.errors import GraphsyncError, GraphsyncWarning
from graphsync.exchange import ProcessGroup
from graphsync.report import LayerReport, RewriteReport, SkippedReport
from graphsync.rewrite import rewrite_towers
from graphsync.verify import VerifyReport, verify

__version__ = "0.1.0"
__all__ = ["rewrite_towers", "verify", "VerifyReport", "ProcessGroup", "GraphsyncError", "GraphsyncWarning", "RewriteReport", "LayerReport",
           "SkippedReport", "__version__"]
