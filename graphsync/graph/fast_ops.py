"""The op builder of graphsync's per-layer arithmetic (`FastOps`): the handful of ops its splice and
exchanges add, made through tf_private.create_op, which skips most of Graph.create_op's per-op cost
(a rewrite adds thousands), with constants shared per device. Kept apart from tf_private, which
only reaches TensorFlow's private API."""
from __future__ import annotations

import contextlib

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from graphsync.graph import tf_private
from graphsync.graph.marks import EXCHANGE_MARKS, Mark


def _type(dtype) -> attr_value_pb2.AttrValue:
    return attr_value_pb2.AttrValue(type=tf.as_dtype(dtype).as_datatype_enum)


class FastOps:
    """The handful of ops graphsync's per-layer arithmetic needs, created through `create_op`, with
    constants cached per device. Same semantics as the tf.* functions of the same names."""

    def __init__(self, graph: tf.Graph):
        self.graph = graph
        self._constants = {}
        self._functions = set()

    def _op(self, op_type, inputs, name=None, **attrs):
        return tf_private.create_op(self.graph, op_type, inputs, attrs, name or op_type).outputs

    def constant(self, value, dtype, shape=None):
        """One constant per value, dtype, shape and device for the whole rewrite: those of the
        aggregation (`Mark.AGGREGATION`) in graphsync/constants/, unmarked: every layer's merge
        reads them; those of a tower in the scope that first needs them. With `shape`, a scalar
        value fills it (a splat: cheap to build whatever the size)."""
        key = (repr(value), tf.as_dtype(dtype).name, shape and tuple(shape), self._device())
        if key not in self._constants:
            shared = tf_private.marked_with(self.graph, Mark.AGGREGATION.value)
            with self.graph.control_dependencies(None), \
                    self.graph.name_scope("graphsync/constants/") if shared else contextlib.nullcontext(), \
                    tf_private.marked(self.graph, dict.fromkeys(m.value for m in EXCHANGE_MARKS)) if shared \
                    else contextlib.nullcontext():
                proto = tf.make_tensor_proto(value, dtype, shape, allow_broadcast=True)   # as tf.constant
                self._constants[key] = self._op("Const", [], "constant", value=attr_value_pb2.AttrValue(tensor=proto),
                                                dtype=_type(dtype))[0]
        return self._constants[key]

    def _device(self) -> str:
        return tf_private.newest_device_name(self.graph)

    def binary(self, op_type, x, y, name=None):
        if not isinstance(y, tf.Tensor):
            y = self.constant(y, x.dtype)
        if not isinstance(x, tf.Tensor):
            x = self.constant(x, y.dtype)
        return self._op(op_type, [x, y], name, T=_type(x.dtype))[0]

    def unary(self, op_type, x, name=None):
        return self._op(op_type, [x], name, T=_type(x.dtype))[0]

    def cast(self, x, dtype, name=None):
        if x.dtype == dtype:
            return x
        return self._op("Cast", [x], name, SrcT=_type(x.dtype), DstT=_type(dtype),
                        Truncate=attr_value_pb2.AttrValue(b=False))[0]

    def stack(self, values, name=None):
        return self._op("Pack", list(values), name, T=_type(values[0].dtype),
                        N=attr_value_pb2.AttrValue(i=len(values)), axis=attr_value_pb2.AttrValue(i=0))[0]

    def unstack(self, value, num):
        return self._op("Unpack", [value], None, T=_type(value.dtype), num=attr_value_pb2.AttrValue(i=num),
                        axis=attr_value_pb2.AttrValue(i=0))

    def sum(self, x, axis, name=None):
        return self._op("Sum", [x, self.constant(axis, tf.int32)], name, T=_type(x.dtype),
                        Tidx=_type(tf.int32), keep_dims=attr_value_pb2.AttrValue(b=False))[0]

    def reshape(self, x, shape, name=None):
        return self._op("Reshape", [x, self.constant(shape, tf.int32)], name, T=_type(x.dtype),
                        Tshape=_type(tf.int32))[0]

    def add_n(self, values, name=None):
        if len(values) == 1:
            return self.unary("Identity", values[0], name)
        return self._op("AddN", list(values), name, T=_type(values[0].dtype),
                        N=attr_value_pb2.AttrValue(i=len(values)))[0]

    def sum_in_order(self, values, name=None):
        """((v0 + v1) + v2) + …: the same bits every run. An AddN of three or more does not fix
        its order: it adds into the first input whose buffer no other op still holds, so which
        tower's value comes first is up to the scheduler whenever another op reads them too
        (one ulp between two runs of the same step). A sum of two is the same bits either way."""
        if len(values) <= 2:
            return self.add_n(values, name)
        total = values[0]
        for value in values[1:-1]:
            total = self.binary("AddV2", total, value)
        return self.binary("AddV2", total, values[-1], name)

    def concat(self, values, name=None):
        return self._op("ConcatV2", list(values) + [self.constant(0, tf.int32)], name, T=_type(values[0].dtype),
                        N=attr_value_pb2.AttrValue(i=len(values)), Tidx=_type(tf.int32))[0]

    def split(self, value, sizes, name=None):
        """Splits along axis 0 into pieces of the given static sizes."""
        return self._op("SplitV", [value, self.constant(list(sizes), tf.int32), self.constant(0, tf.int32)], name,
                        T=_type(value.dtype), Tlen=_type(tf.int32), num_split=attr_value_pb2.AttrValue(i=len(sizes)))

    def call(self, function, inputs, name):
        """One `PartitionedCall` of `function` (a traced tf.function's ConcreteFunction), whose
        definition joins the graph's library on first use; TensorFlow inlines it before running.

        Its outputs take the shapes the trace gave them: TensorFlow would otherwise infer them by
        running shape inference over the whole body, for every call (460 µs a call, against 127 µs
        with the shapes set here)."""
        if function.name not in self._functions:
            tf_private.add_function(function, self.graph)
            self._functions.add(function.name)
        types = lambda tensors: attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(  # noqa: E731
            type=[t.dtype.as_datatype_enum for t in tensors]))
        empty = attr_value_pb2.AttrValue(s=b"")
        outputs = self._op("PartitionedCall", list(inputs), name, Tin=types(inputs), Tout=types(function.outputs),
                           f=attr_value_pb2.AttrValue(func=attr_value_pb2.NameAttrList(name=function.name)),
                           config=empty, config_proto=empty, executor_type=empty,
                           _disable_call_shape_inference=attr_value_pb2.AttrValue(b=True))
        for output, traced in zip(outputs, function.outputs):
            output.set_shape(traced.shape)
        return outputs
