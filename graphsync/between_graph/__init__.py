"""Between-graph replication: one graph per worker process, synchronized across processes.

    process_group  ProcessGroup: this graph is task `index` of `tasks` worker graphs
    cluster        which worker this process is (TF_CONFIG, or the server the script starts)
    peers          the workers' first meeting, within a bounded wait
    heartbeat      noticing that another worker is gone, whatever the step time
    health_probe   asking a peer's server whether it is alive, and which incarnation it is
    steps          which session runs are synchronized steps, and stopping them
    lost_worker    stopping a worker whose peer is lost: one line, status 1
    watched_steps  the same watch for rewrite_towers(process_group=ProcessGroup(…, heartbeat=…))
"""
