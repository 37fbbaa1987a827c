"""What `verify` feeds and fetches, found in the graph itself by structure (names only pair the
same thing across towers). One module per way of finding it:

| what                                                        | module       |
|-------------------------------------------------------------|--------------|
| towers (as the rewrite finds them, or --towers); which tower an op belongs to (MirroredStrategy's unscoped replica 0 included) | tower_scopes.py |
| sources of examples: placeholders, tf.data iterators, queues, staging areas, random tensors | example_sources.py |
| per-tower placeholders or pipelines; one whole batch split, sliced, strided or unstacked into the towers; MirroredStrategy's per-replica iterators; a batch read as a whole; each tower's inputs by its own data path, wherever their ops' names sit (tensorpack makes every tower's in the first tower's scope) | entries.py |
| inputs made inside each tower (random or decoded tensors + casts): the tensor the first layer reads; dropout and noise are no input | synthetic.py |
| the same input in every tower, paired by dtype, shape, the layers reading it and their place in the data path | pairing.py |
| --input and --feed; fixed values for flags and scalars; shapes and dtypes checked | inputs.py, subject.py |
| range of integer inputs: logits' width, one-hot depth, table size, a random int's maxval | classes.py |
| the loss (--loss, `losses` collection, what tf.gradients differentiates, named scalars, or none; the first that depends on the examples) | loss.py |
| gradients applied, writes, variables' initial values | state.py |
| which writes are moving statistics of the batch (judged) and which are not (moving summaries of one tower's scalars: compared apart) | statistics.py |
| per-tower copies of the main tower's variables (replicated trainers), started equal | copies.py |
| per-tower batch-norm ops and synchronized layers, in forward order | batch_norm.py |
| all of it together: `discover(graph) -> Subject`            | subject.py   |
"""
from graphsync.verification.discovery.inputs import Input
from graphsync.verification.discovery.state import Variable
from graphsync.verification.discovery.subject import Subject, discover

__all__ = ["discover", "Subject", "Input", "Variable"]
