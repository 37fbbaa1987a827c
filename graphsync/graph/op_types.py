"""Op types more than one stage recognizes, named once (no TensorFlow import: `graphsync run`
reads them before the script imports TensorFlow)."""

COLLECTIVE_TYPES = ("CollectiveReduce", "CollectiveReduceV2", "CollectiveGather", "CollectiveGatherV2",
                    "CollectiveBcastSend", "CollectiveBcastRecv", "CollectiveBcastSendV2",
                    "CollectiveBcastRecvV2", "CollectiveAllToAllV2", "CollectiveReduceScatterV2")

# Marks the ops of a cross-process exchange that are no collective (graphsync/exchange/queues.py):
# a step that runs them waits for the other workers, as one with collectives does.

# Ops that assign a variable (ref or resource): moving-average updates, as the planner and verify see them.
WRITE_TYPES = ("Assign", "AssignAdd", "AssignSub", "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp")
