"""Op types more than one stage recognizes, named once (no TensorFlow import: `graphsync run`
reads them before the script imports TensorFlow)."""

COLLECTIVE_TYPES = ("CollectiveReduce", "CollectiveReduceV2", "CollectiveGather", "CollectiveGatherV2",
                    "CollectiveBcastSend", "CollectiveBcastRecv", "CollectiveBcastSendV2",
                    "CollectiveBcastRecvV2", "CollectiveAllToAllV2", "CollectiveReduceScatterV2")
