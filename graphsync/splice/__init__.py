"""Every edit graphsync makes to a graph, from a validated plan.

    layer          splice_layer: one planned layer's synchronized ops, and every edge moved onto them
    fused_kernels  the fused layer rebuilt from TensorFlow's own fused kernels, and their gradients
    stand_in       a layer behind a tensor training flag: gates, a stand-in fused layer, merges
    inline         tf.function calls in the towers inlined before planning (after a rehearsal)
    segments       recompute="segments": each layer's region, the copies, triggers for later gradients
    segment_cost   where to cut the layers into segments: the memory each cut would hold at its peak
    copyable       what a recompute may copy: activation-sized tensors, ops that run again alike
"""
