"""Op types more than one stage recognizes, named once (no TensorFlow import: `graphsync run`
reads them before the script imports TensorFlow)."""

COLLECTIVE_TYPES = ("CollectiveReduce", "CollectiveReduceV2", "CollectiveGather", "CollectiveGatherV2",
                    "CollectiveBcastSend", "CollectiveBcastRecv", "CollectiveBcastSendV2",
                    "CollectiveBcastRecvV2", "CollectiveAllToAllV2", "CollectiveReduceScatterV2")

# TensorFlow's fused batch norms, in training or inference mode (their gradients are *Grad types).
FUSED_BATCH_NORM_TYPES = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")

# Ops that read only a tensor's shape, never its values: a gradient reads the forward's this way.
SHAPE_TYPES = ("Shape", "ShapeN", "Size", "Rank")

# Ops that assign a variable (ref or resource): moving-average updates, as the planner and verify see them.
WRITE_TYPES = ("Assign", "AssignAdd", "AssignSub", "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp")
