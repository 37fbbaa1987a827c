"""Pairing the same layer across towers, and checking everything before the first edit.

    options        RewriteOptions: what the user asked of a rewrite, validated when built
    data           the plan: frozen records of layers, their sites in each tower, gradient calls
    planner        make_plan: candidates → towers → pairs → validated layers
    training_flag  the checks of layers behind a tensor training flag (one flag for all towers)
    shared_tasks   the parameter servers a between-graph step uses (a step on another worker: refused)
    normalizations which layers are one normalization, for reports (a batch norm by hand: several reductions)
"""
