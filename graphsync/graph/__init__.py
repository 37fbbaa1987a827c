"""TensorFlow primitives that know nothing of batch norm; every other stage builds on them.

    tf_private  every private TensorFlow API graphsync touches, one wrapper each
    fast_ops    the op builder of graphsync's per-layer arithmetic (through tf_private.create_op)
    reroute     moving edges from old tensors and ops to their replacements, checked
    order       the order the forward pass runs ops in (listings read input to output)
    shapes      static shapes as plain ints and None, whichever TensorFlow behaviour built them
    op_types    op types several stages recognize (collectives)
    backward    which ops belong to a backward pass, by structure (never by a scope's name)
    tape        which forward op each of a GradientTape's gradient functions differentiated
    walks       walks every stage takes: forward readers, reads of a variable, descendants
    ref_races   reads of TF1 ref variables that race their own update in one step
"""
